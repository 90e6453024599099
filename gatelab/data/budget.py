"""How many training tokens a run's corpus holds, counted without downloading, tokenizing or training anything: for
`gatelab sweep plan`'s corpus and passes columns, and for the warning a run gives when it would repeat its data.

Exact when the run's tokenizer (same `tokenizer_key`: training splits, vocabulary size, settings) is cached and the
token sidecars of its domains' training splits are there (``n_tokens`` of each ``<domain>.train.json``). Otherwise an
estimate from the manifest: each training split's characters over a characters-per-token ratio, plus the BOS and EOS
every document is framed with. The ratio comes from the nearest vocabulary size among the token caches of the same
text on disk and the figures measured on the built-in corpora below. A `bigram_backcopy` corpus is generated, so its
size is known exactly. Unprepared domains cannot be counted: the count is None. A `data.tokenizer` file or Hub name is
exact from the token cache of that tokenizer's fingerprint, else estimated at the BPE's ratio for `vocab_size` (a rough
figure for a tokenizer trained on other text).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gatelab.config import DataConfig
from gatelab.data.corpora import CorpusManifest, DataError, default_data_dir

# Characters per text token (BOS and EOS left out) of the built-in corpora's training splits, for a byte-level BPE
# trained as `load_or_train_tokenizer` trains it on all five domains (2M characters a domain), at four vocabulary
# sizes: measured by training each tokenizer and encoding every training split. A larger vocabulary merges more, so
# the ratio grows with it; the 32768 figure stands in for larger vocabularies too, where it overcounts the tokens a
# little. "all" is the ratio over the five domains, the stand-in for a user's own text when nothing else is known.
MEASURED_CHARS_PER_TOKEN: dict[int, dict[str, float]] = {
    512: {"speeches": 2.141, "fiction": 1.996, "nonfiction": 2.027, "scripture": 2.209, "code": 1.945, "all": 2.057},
    4096: {"speeches": 3.971, "fiction": 3.195, "nonfiction": 3.439, "scripture": 3.611, "code": 3.151, "all": 3.496},
    16384: {"speeches": 4.935, "fiction": 3.838, "nonfiction": 4.314, "scripture": 4.139, "code": 3.770, "all": 4.234},
    32768: {"speeches": 5.179, "fiction": 4.101, "nonfiction": 4.636, "scripture": 4.273, "code": 3.971, "all": 4.461},
}
PREPARE_HINT = "run `gatelab data prepare PRESET` to count the corpus"


@dataclass(frozen=True)
class CorpusCount:
    """A corpus's training tokens: `how` is exact, estimate or unknown (tokens None); `note` says how or why."""

    tokens: int | None
    how: Literal["exact", "estimate", "unknown"]
    note: str = ""

    def passes(self, train_tokens: int) -> float | None:
        return train_tokens / self.tokens if self.tokens else None


def format_tokens(count: float) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if count >= scale:
            return f"{count / scale:.3g}{suffix}"
    return f"{count:.3g}"


MIN_STEPS_WORTH_A_RUN = 10  # below this, "lower max_steps to one pass" suggests a run that trains almost nothing


def repeat_warning(subject: str, data: DataConfig, train_tokens: int, corpus_tokens: int | None,
                   tokens_per_step: int, estimated: bool = False) -> str | None:
    """The warning for `subject` ("this run", "runs 0-2") when it would pass over its corpus more than once, else None.

    It names the factor and the two ways out: more data, or at most the steps that make one pass.
    """
    if not corpus_tokens or train_tokens <= corpus_tokens:
        return None
    passes = train_tokens / corpus_tokens
    about = "about " if estimated else ""
    more = {"files": "add files to data.files.paths (or raise data.files.max_documents)",
            "hf": "use a larger split of data.hf (or raise data.hf.max_documents)",
            }.get(data.source, "add text (data.user_files, named in data.domains)")
    if data.task == "bigram_backcopy":
        more = "raise data.bigram_backcopy.train_sequences"
    one_pass = corpus_tokens // tokens_per_step
    # Lowering max_steps is advice only where a pass is a run worth making; a pass of a handful of steps is no run.
    fewer = (f"or lower train.max_steps to {one_pass:,} for one pass" if one_pass >= MIN_STEPS_WORTH_A_RUN
             else f"one pass is only {one_pass:,} step(s) of {format_tokens(tokens_per_step)} tokens: the corpus is "
                  "far too small for this model, so bring the data or pick a smaller preset")
    their = "their" if subject.startswith("runs") else "its"
    return (f"{subject} would pass over {their} corpus {about}{passes:,.0f}x" if passes >= 100 else
            f"{subject} would pass over {their} corpus {about}{passes:.3g}x") + \
        f" ({format_tokens(train_tokens)} training tokens from {about}{format_tokens(corpus_tokens)}): {more}, {fewer}"


@dataclass
class _DataDir:
    """What one data directory holds, each part read at most once per counter."""

    root: Path
    manifest: CorpusManifest | None = None
    manifest_error: str = ""
    _tokenizers: dict[str, tuple[str, int]] | None = None  # tokenizer key -> (fingerprint, vocabulary size)
    _sidecars: dict[tuple[str, str], int | None] = field(default_factory=dict)

    def tokenizers(self) -> dict[str, tuple[str, int]]:
        """Every cached tokenizer that loads, by key. Loading is the only way to its fingerprint (the hash of its
        serialized state, which is not the file's bytes); a few milliseconds each."""
        if self._tokenizers is None:
            from tokenizers import Tokenizer

            from gatelab.data.tokenizer import tokenizer_fingerprint

            self._tokenizers = {}
            for path in sorted((self.root / "tokenizers").glob("*/tokenizer.json")):
                try:
                    tokenizer = Tokenizer.from_file(str(path))
                except Exception:  # noqa: BLE001, S112  the tokenizers library raises bare Exception on a damaged file
                    continue  # which `gatelab train` retrains; here it only counts nothing
                self._tokenizers[path.parent.name] = (tokenizer_fingerprint(tokenizer), tokenizer.get_vocab_size())
        return self._tokenizers

    def train_tokens(self, fingerprint: str, domain: str) -> int | None:
        """n_tokens of the domain's cached training split under that tokenizer, if its shards were finished from the
        manifest's text, else None."""
        if (fingerprint, domain) not in self._sidecars:
            self._sidecars[(fingerprint, domain)] = self._read_sidecar(fingerprint, domain)
        return self._sidecars[(fingerprint, domain)]

    def _read_sidecar(self, fingerprint: str, domain: str) -> int | None:
        from gatelab.data.datasets import cached_split_tokens

        try:
            source_sha256 = self.manifest.record(domain).train.sha256
        except DataError:
            return None
        return cached_split_tokens(self.root / "tokens" / fingerprint, domain, "train", source_sha256)


class CorpusCounter:
    """`count(data, vocab_size)` with a cache per distinct (data config, vocabulary size) and per data directory, so a
    plan of a hundred runs reads the manifest, tokenizers and sidecars once."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, int], CorpusCount] = {}
        self._dirs: dict[Path, _DataDir] = {}

    def __call__(self, data: DataConfig, vocab_size: int) -> CorpusCount:
        key = (data.model_dump_json(), vocab_size)
        if key not in self._counts:
            self._counts[key] = self._count(data, vocab_size)
        return self._counts[key]

    def _data_dir(self, data: DataConfig) -> _DataDir:
        if data.source != "builtin":
            from gatelab.data.external import corpus_dir

            root = corpus_dir(data)  # a files or hf source keeps its own manifest, counted as the built-in one
        else:
            root = Path(data.data_dir).expanduser() if data.data_dir else default_data_dir()
        if root not in self._dirs:
            state = _DataDir(root)
            try:
                state.manifest = CorpusManifest.load(root)
            except DataError as error:
                state.manifest_error = str(error)
            self._dirs[root] = state
        return self._dirs[root]

    def _count(self, data: DataConfig, vocab_size: int) -> CorpusCount:
        if data.task == "bigram_backcopy":
            return CorpusCount(data.bigram_backcopy.train_sequences * (data.seq_len + 1), "exact",
                               "generated: train_sequences x (seq_len + 1)")
        state = self._data_dir(data)
        if state.manifest is None:
            return CorpusCount(None, "unknown", f"{state.manifest_error}; {PREPARE_HINT}")
        domains = list(dict.fromkeys(data.domains)) or list(state.manifest.domains)  # []: all the source has
        if not domains:
            return CorpusCount(None, "unknown", f"the {data.source} source is not prepared in {state.root}: "
                                                "`gatelab data prepare PRESET` prepares it")
        unprepared = [d for d in domains if d not in state.manifest.domains]
        if unprepared:
            return CorpusCount(None, "unknown", f"{', '.join(unprepared)} not prepared in {state.root}: {PREPARE_HINT}")
        if data.tokenizer != "bpe":
            return self._foreign(state, data, domains, vocab_size)
        exact = self._exact(state, domains, vocab_size)
        if exact is not None:
            return CorpusCount(exact, "exact", f"token cache of {', '.join(domains)} in {state.root}")
        return self._estimate(state, domains, vocab_size)

    @staticmethod
    def _exact(state: _DataDir, domains: list[str], vocab_size: int) -> int | None:
        from gatelab.data.tokenizer import tokenizer_key

        cached = state.tokenizers().get(tokenizer_key(state.manifest, vocab_size, domains))
        if cached is None:
            return None
        counts = [state.train_tokens(cached[0], domain) for domain in domains]
        return None if None in counts else sum(counts)

    def _foreign(self, state: _DataDir, data: DataConfig, domains: list[str], vocab_size: int) -> CorpusCount:
        from gatelab.data.tokenizer import load_foreign_tokenizer, tokenizer_fingerprint

        fingerprint = tokenizer_fingerprint(load_foreign_tokenizer(data.tokenizer, data.bos_token,
                                                                   data.eos_token).tokenizer)
        counts = [state.train_tokens(fingerprint, domain) for domain in domains]
        if None not in counts:
            return CorpusCount(sum(counts), "exact", f"token cache of {', '.join(domains)} in {state.root}")
        return self._estimate(state, domains, vocab_size)

    @staticmethod
    def _estimate(state: _DataDir, domains: list[str], vocab_size: int) -> CorpusCount:
        on_disk: dict[str, list[tuple[int, float]]] = {}  # domain -> (vocabulary size, characters per text token)
        for fingerprint, vocab in state.tokenizers().values():
            for domain in domains:
                record = state.manifest.domains[domain].train
                n_tokens = state.train_tokens(fingerprint, domain)
                if n_tokens is not None and n_tokens > 2 * record.documents:
                    on_disk.setdefault(domain, []).append((vocab, record.chars / (n_tokens - 2 * record.documents)))
        total, sources = 0, set()
        for domain in domains:
            record = state.manifest.domains[domain].train
            ratio, source = _nearest_ratio(domain, vocab_size, on_disk.get(domain, []))
            total += round(record.chars / ratio) + 2 * record.documents
            sources.add(source)
        return CorpusCount(total, "estimate", "no token cache for this tokenizer yet: estimated from the manifest's "
                                              f"characters at the characters per token of {', '.join(sorted(sources))}")


def built_in_chars_per_token(vocab_size: int) -> float:
    """The built-in corpora's characters per token over their five domains, at the measured vocabulary size nearest to
    `vocab_size`: the stand-in for text not yet tokenized."""
    return _nearest_ratio("all", vocab_size, [])[0]


def _nearest_ratio(domain: str, vocab_size: int, on_disk: list[tuple[int, float]]) -> tuple[float, str]:
    """The characters per token at the vocabulary size nearest to `vocab_size` (on a log scale, as merges grow):
    a token cache of the same text wins a tie over the measured figures, which stand in for a user domain by "all"."""
    candidates = [(abs(math.log(vocab / vocab_size)), 0, ratio, f"the vocab-{vocab} token cache")
                  for vocab, ratio in on_disk]
    for vocab, ratios in MEASURED_CHARS_PER_TOKEN.items():
        which = domain if domain in ratios else "all"
        label = "the built-in corpora" if which == domain else "the built-in corpora as a stand-in"
        candidates.append((abs(math.log(vocab / vocab_size)), 1, ratios[which], f"{label} at vocab {vocab}"))
    _, _, ratio, source = min(candidates)
    return ratio, source
