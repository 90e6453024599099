"""`train.compile`: inductor's on-disk caches shared by every run of a runs folder, and a line saying what compiling
cost.

Inductor caches a compiled graph under a key of the graph, its input shapes and dtypes, the torch version and its
settings. A cache in the runs folder, not /tmp, is shared by every run and worker of a sweep, on one machine or a
shared file system, so only the first run of each variant and shape compiles: the next load the kernels in seconds.
A TORCHINDUCTOR_CACHE_DIR the user set is kept.
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path

import lightning as L
import torch

from gatelab.progress import is_verbose

CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"
CACHE_FOLDER = "compile-cache"
# CompileReport's line, as a run's log says it: seconds, graphs loaded from the cache, graphs compiled
COMPILED_LINE = re.compile(r"compiled in ([\d.]+) s: (\d+) graph\(s\) loaded from the cache, (\d+) compiled")


def share_cache(runs_dir: Path) -> Path:
    """Inductor's cache folder for this process: the user's TORCHINDUCTOR_CACHE_DIR, else `runs_dir/compile-cache`."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    # Inductor writes its default into the variable the first time it reads it (torch's imports may already have)
    if os.environ.get(CACHE_VARIABLE) in (None, "", os.path.abspath(default_cache_dir())):
        os.environ[CACHE_VARIABLE] = str((runs_dir / CACHE_FOLDER).resolve())
    cache = Path(os.environ[CACHE_VARIABLE])
    DAMAGED_ENTRY.cache = cache
    if not is_verbose() and DAMAGED_ENTRY not in INDUCTOR_CACHE_LOG.filters:
        INDUCTOR_CACHE_LOG.addFilter(DAMAGED_ENTRY)
    return cache


class DamagedCacheEntry(logging.Filter):
    """Inductor meets an unreadable entry in its cache (a process killed while writing it, a full disk, a damaged
    file), logs a warning with the whole traceback, and compiles that graph again: the run is unharmed. This says so in
    one line, once a process, without the traceback (`--verbose` keeps inductor's own)."""

    UNREADABLE = "fx graph cache unable to load compiled graph"

    def __init__(self) -> None:
        super().__init__()
        self.cache: Path | None = None
        self.said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self.UNREADABLE):
            return True
        if self.said:
            return False
        self.said = True
        error = record.exc_info[1] if record.exc_info else None
        record.msg = "compile cache %s: an unreadable entry (%s) is compiled again; nothing is lost"
        record.args = (self.cache, f"{type(error).__name__}: {error}" if error else "no detail")
        record.exc_info, record.exc_text = None, None
        return True


INDUCTOR_CACHE_LOG = logging.getLogger("torch._inductor.codecache")
DAMAGED_ENTRY = DamagedCacheEntry()


def forget_earlier_graphs() -> None:
    """Drops the compiled graphs of this process's earlier runs (a sweep worker trains many). Dynamo keeps every
    graph of a function with its guards, and past 8 of them (`recompile_limit`) it runs the function eager without
    failing: a worker's ninth variant would train eager. Each run's graphs load from the on-disk cache in seconds."""
    torch.compiler.reset()


def cache_counts() -> dict[str, int]:
    """Inductor's FX graph cache hits and misses in this process so far (a forward and a backward graph per region)."""
    from torch._dynamo.utils import counters

    return {"loaded": counters["inductor"]["fxgraph_cache_hit"], "compiled": counters["inductor"]["fxgraph_cache_miss"]}


class CompileReport(L.Callback):
    """Times the first training step, where the forward and backward graphs compile (or load from the cache), against
    the step after it: `compile_s` is the difference. Says it in one line, and keeps it for the `time/compile_s` metric.
    """

    def __init__(self, cache: Path, log=print) -> None:
        self.cache, self.say = cache, log
        self.compile_s: float | None = None
        self._started: list[float] = []
        self._counts_before: dict[str, int] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if len(self._started) == 0:
            self._counts_before = cache_counts()
            if not trainer.global_rank:  # the first step can take a minute: say why nothing moves
                self.say(f"compiling the model for its first step (train.compile; graphs an earlier run of this "
                         f"shape compiled load from the inductor cache {self.cache})")
        if len(self._started) < 3:
            self._started.append(time.perf_counter())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if len(self._started) != 3 or self.compile_s is not None:
            return
        first_s, second_s = (self._started[1] - self._started[0]), (self._started[2] - self._started[1])
        self.compile_s = max(0.0, first_s - second_s)
        if not trainer.global_rank:
            self.say(f"compiled in {self.compile_s:.1f} s: {self._what_the_cache_did()}")

    def on_train_end(self, trainer, pl_module) -> None:
        """A run of one or two steps has no step after the first to subtract: it says what the cache did, and the
        first step's time as the most the compiling took (no `time/compile_s`: that would be a guess)."""
        if self.compile_s is not None or not self._started or trainer.global_rank:
            return
        first_s = (self._started[1] if len(self._started) > 1 else time.perf_counter()) - self._started[0]
        self.say(f"compiled in at most {first_s:.1f} s (the first step; too few steps to time the compiling apart): "
                 f"{self._what_the_cache_did()}")

    def _what_the_cache_did(self) -> str:
        counts = {name: value - self._counts_before.get(name, 0) for name, value in cache_counts().items()}
        return (f"{counts['loaded']} graph(s) loaded from the cache, {counts['compiled']} compiled (inductor cache "
                f"{self.cache})")
