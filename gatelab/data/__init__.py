"""Offline corpora in named domains, a locally trained byte-level BPE, and seed-ordered token datasets."""

import importlib

# Each public name and the submodule that defines it, imported on first use (PEP 562): `gatelab.data.resolve` and
# `gatelab.data.identity`, which every command that reads an experiment file imports, then load neither torch nor the
# corpora (1.3 s) before a bad file's message.
_HOMES = {
    "corpora": ("DOMAINS", "CorpusManifest", "DataError", "Document", "domains_from_files", "prepare_corpora"),
    "datasets": ("PackedDataset", "TokenCorpus", "heldout_windows", "long_context_windows", "tokenize_corpus",
                 "train_dataset", "unigram_perplexity"),
    "tokenizer": ("BOS", "EOS", "PAD", "bos_id", "eos_id", "load_or_train_tokenizer", "pad_id"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str):
    if name not in _HOME_OF:
        raise AttributeError(f"module 'gatelab.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"gatelab.data.{_HOME_OF[name]}"), name)


__all__ = sorted(_HOME_OF)
