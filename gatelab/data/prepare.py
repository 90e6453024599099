"""Everything a run needs before it trains: corpora, tokenizer and token shards, each made once under the data
directory and cached; `gatelab data prepare EXPERIMENT` and `gatelab train` both come through `load_data`.

One process at a time prepares a data directory (an exclusive lock on it), so workers and DDP ranks that start on a
cold cache never race: the later ones find everything made.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import IO

from gatelab import host
from gatelab.config import ExperimentConfig
from gatelab.data.budget import repeat_warning
from gatelab.data.corpora import CorpusManifest, default_data_dir, prepare_corpora
from gatelab.data.datasets import check_windows, tokenize_corpus
from gatelab.data.documents import writes_into
from gatelab.data.shards import Progress
from gatelab.data.synthetic import DOMAIN as BIGRAM_BACKCOPY
from gatelab.data.synthetic import BigramBackcopy
from gatelab.data.tokenizer import TRAINED_BPE, load_foreign_tokenizer, load_or_train_tokenizer
from gatelab.errors import GatelabError


def load_data(experiment: ExperimentConfig, log=print, warn=print, progress: Progress | None = None):
    """(tokenizer, corpus, domains): corpora, tokenizer and token streams, each prepared once and cached under the data
    directory; for `data.task: bigram_backcopy` (None, the synthetic corpus generated in memory, its one domain).

    `warn` reports what changes the result (training data that would repeat) even when `log` is silenced;
    `progress` hears how tokenizing goes (`BarProgress` draws a bar). A domain of `data.domains` that cannot be
    prepared is an error, before anything trains.
    """
    data = experiment.data
    if data.task == "bigram_backcopy":
        task = BigramBackcopy.from_config(data.bigram_backcopy, experiment.model.vocab_size)
        log(f"bigram-backcopy: triggers {task.trigger_ids.tolist()}, entropy rate {task.entropy_rate:.3f} nats, "
            f"{data.bigram_backcopy.train_sequences:,}/{data.bigram_backcopy.heldout_sequences:,} sequences "
            "(train/heldout)")
        corpus = task.corpus(data.seq_len)
        _warn_if_repeated(experiment, corpus, [BIGRAM_BACKCOPY], warn)
        return None, corpus, [BIGRAM_BACKCOPY]
    sources = None
    if data.source != "builtin":
        from gatelab.data.external import prepare_source, source_identity

        # A glob that matches nothing fails here, before the data directory is touched. The files' paths, sizes and
        # mtimes (or the Hub coordinates) go into the token manifest: hashing gigabytes of shards is what it avoids.
        sources = {data.source: source_identity(data)}
    data_dir = Path(data.data_dir).expanduser() if data.data_dir else default_data_dir()
    with writes_into(data_dir), _one_process_at_a_time(data_dir, say=warn):
        if data.source != "builtin":
            manifest = prepare_source(data, log=log)
            present = list(data.domains) or manifest.available_domains
            unknown = [d for d in present if d not in manifest.available_domains]
            if unknown:  # unlike a built-in domain, one of the user's can only be missing by a typo
                raise GatelabError(f"data.domains: {', '.join(unknown)} not in the {data.source} source, whose "
                                   f"domains are {', '.join(manifest.available_domains)}")
        else:
            manifest = prepare_corpora(data.data_dir, [d for d in data.domains if d not in data.user_files], log=log)
            if data.user_files:
                from gatelab.data.corpora import domains_from_files

                manifest = domains_from_files(data.user_files, data.data_dir, log=log)
            _require_every_domain(manifest, data.domains)
            present = list(data.domains)
        if data.tokenizer == TRAINED_BPE:
            tokenizer, framing = load_or_train_tokenizer(manifest, experiment.model.vocab_size, present, log=log), None
        else:
            foreign = load_foreign_tokenizer(data.tokenizer, data.bos_token, data.eos_token)
            tokenizer, framing = foreign.tokenizer, (foreign.bos_id, foreign.eos_id)
            log(f"tokenizer {data.tokenizer} ({foreign.vocab_size} ids), documents framed "
                f"{foreign.bos} ... {foreign.eos}")
        corpus = tokenize_corpus(manifest, tokenizer, present, log=log, framing=framing,
                                 shard_bytes=int(data.shard_mb * (1 << 20)), progress=progress,
                                 sources=sources, warn=warn)
    check_windows(corpus, present, data.seq_len)
    _warn_if_repeated(experiment, corpus, present, warn)
    return tokenizer, corpus, present


def _require_every_domain(manifest: CorpusManifest, domains: list[str]) -> None:
    """A run trains on every domain it names or not at all: its params and spec hash name them all, so training on
    fewer would record one run and train another. Leaving a domain out is a change to data.domains, a different run."""
    missing = [d for d in domains if d not in manifest.available_domains]
    if not missing:
        return
    reasons = "; ".join(_why_missing(manifest, d) for d in missing)
    rest = [d for d in domains if d not in missing]
    leave_out = (f", or leave {'it' if len(missing) == 1 else 'them'} out with --set data.domains=[{','.join(rest)}] "
                 "(a different run: its spec hash changes)") if rest else ""
    raise GatelabError(f"data.domains: {', '.join(missing)} could not be prepared in {manifest.data_dir}: {reasons}. "
                       f"Fix the source and run `gatelab data prepare PRESET`{leave_out}")


def _why_missing(manifest: CorpusManifest, domain: str) -> str:
    record = manifest.missing.get(domain)
    if record is None:
        return f"{domain}: not in {manifest.path}"
    reason = " ".join(record.reason.split())  # a tool's stderr may run over lines: the error is one
    return f"{domain} needs {', '.join(record.sources)} ({reason}; to fetch by hand: {record.command})"


def _warn_if_repeated(experiment: ExperimentConfig, corpus, domains: list[str], warn) -> None:
    """The plan's warning, now with the exact count: this run would pass over its training tokens more than once."""
    train, seq_len = experiment.train, experiment.data.seq_len
    corpus_tokens = sum(len(corpus.tokens(domain, "train")) for domain in domains)
    message = repeat_warning("this run", experiment.data, train.max_steps * train.batch_size * seq_len, corpus_tokens,
                             train.batch_size * seq_len)
    if message:
        warn(f"warning: {message}")


@contextmanager
def _one_process_at_a_time(data_dir: Path, say=print):
    """Holds an exclusive lock on the data directory while a process prepares (or merely checks) its cache; a wait of
    more than LOCK_QUIET_S is said through `say`, naming the lock and its holder, again every LOCK_REPEAT_S."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / ".prepare.lock"
    with _open_lock(path) or nullcontext() as lock:
        if lock is not None:
            _wait_for(lock, path, say)  # released when the file closes, also when its process dies
        yield


LOCK_QUIET_S = 5.0  # a wait this long passes without a word: another process checking a warm cache
LOCK_REPEAT_S = 10.0
_LOCK_POLL_S = 0.1


def _wait_for(lock: IO, path: Path, say) -> None:
    """Take the exclusive flock on `lock`, saying what it waits for while another process holds it."""
    started = time.monotonic()
    next_word = started + LOCK_QUIET_S
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if time.monotonic() >= next_word:
            say(f"waiting {time.monotonic() - started:.0f} s for the data directory's lock {path}, held by "
                f"{_holder(path)}")
            next_word = time.monotonic() + LOCK_REPEAT_S
        time.sleep(_LOCK_POLL_S)


def _holder(path: Path) -> str:
    """Who holds the lock on `path`, and how to free it where that process is stopped."""
    pids = [pid for pid in host.lock_holders(path) if pid != os.getpid()]
    if not pids:
        return "another process (it is preparing or checking this data directory)"
    pid = pids[0]
    if host.is_stopped(pid):
        return (f"PID {pid}, which is stopped (SIGSTOP or Ctrl-Z): `kill -CONT {pid}` lets it finish, "
                f"`kill -KILL {pid}` ends it and frees the lock")
    return f"PID {pid}, which is preparing or checking this data directory"


def _open_lock(path: Path) -> IO | None:
    """The lock file, opened for flock: read-only where this user cannot write it (flock needs no write access), and
    None where it cannot be created either. A read-only cache is then read without a lock (no process can be writing
    it), and whatever would have to be written fails as one error about the folder (`writes_into`)."""
    try:
        return open(path, "a")
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
    try:
        return open(path)
    except FileNotFoundError:
        return None


class BarProgress(Progress):
    """A rich progress bar over the text to tokenize: documents, tokens/s and time left (by bytes of text covered)."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, TextColumn, TimeRemainingColumn
        from rich.progress import Progress as Bar

        self._bar = Bar(TextColumn("tokenizing"), BarColumn(), TextColumn("{task.fields[documents]:>12,} documents"),
                        TextColumn("{task.fields[rate]:>12,.0f} tokens/s"), TimeRemainingColumn(), transient=False)
        self._task = None
        self._documents = self._tokens = 0
        self._since = time.perf_counter()

    def start(self, total_bytes: int) -> None:
        self._bar.start()
        self._task = self._bar.add_task("tokenizing", total=max(total_bytes, 1), documents=0, rate=0.0)
        self._since = time.perf_counter()

    def advance(self, documents: int, tokens: int, bytes_: int) -> None:
        self._documents += documents
        self._tokens += tokens
        rate = self._tokens / max(time.perf_counter() - self._since, 1e-9)
        self._bar.update(self._task, advance=bytes_, documents=self._documents, rate=rate)

    def stop(self) -> None:
        self._bar.stop()
