"""Offline corpora in named domains, a locally trained byte-level BPE, and seed-ordered token datasets."""

from gatelab.data.corpora import DOMAINS, CorpusManifest, DataError, Document, domains_from_files, prepare_corpora
from gatelab.data.datasets import (
    PackedDataset,
    TokenCorpus,
    heldout_windows,
    long_context_windows,
    tokenize_corpus,
    train_dataset,
    unigram_perplexity,
)
from gatelab.data.tokenizer import BOS, EOS, PAD, bos_id, eos_id, load_or_train_tokenizer, pad_id

__all__ = [
    "BOS",
    "DOMAINS",
    "EOS",
    "PAD",
    "CorpusManifest",
    "DataError",
    "Document",
    "PackedDataset",
    "TokenCorpus",
    "bos_id",
    "domains_from_files",
    "eos_id",
    "heldout_windows",
    "load_or_train_tokenizer",
    "long_context_windows",
    "pad_id",
    "prepare_corpora",
    "tokenize_corpus",
    "train_dataset",
    "unigram_perplexity",
]
