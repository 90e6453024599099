"""Part 2a of `gatelab bench --data`: the windows/s `StepBatches` delivers over the synthetic corpus (directly, and
through a DataLoader with 0 and 2 worker processes; its shards in the page cache, and evicted from it), beside a
memory-mapped reader, against the windows/s the tiny preset's model consumes; and how many resident MB a random window
maps."""

from __future__ import annotations

import gc
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from gatelab.bench.data.page_cache import evict_page_cache, resident_fraction, warm_page_cache
from gatelab.bench.data.report import GATELAB_READER, MEMMAP_READER, Sizes, fmt
from gatelab.bench.data.synthetic import SYNTH_DOMAIN, load_synthetic, shard_paths
from gatelab.bench.data.system import smaps_rollup, status_kb
from gatelab.bench.steps import plain_step
from gatelab.bench.timing import time_interleaved
from gatelab.data.datasets import PackedDataset, train_dataset
from gatelab.data.resolve import load_experiment
from gatelab.host import repo_root

Log = Callable[[str], None]

PROBE_PREAD = "not cached, read with os.pread (no mapping)"


class MemmapStream:
    """A `TokenStream`'s shards read through memory maps (`np.memmap`, one a shard, opened on first use), as gatelab's
    `TokenStream` read them before it took positioned reads: the reader set beside gatelab's for comparison, not
    gatelab's own. Slices like a TokenStream (step 1)."""

    def __init__(self, stream) -> None:
        self.paths, self.starts, self.dtype = list(stream.paths), stream.starts, np.dtype(stream.dtype)
        self._maps: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, index: slice) -> np.ndarray:
        start, stop, _ = index.indices(len(self))
        pieces, k = [], int(np.searchsorted(self.starts, start, side="right")) - 1
        while start < stop:
            end = min(stop, int(self.starts[k + 1]))
            if k not in self._maps:
                self._maps[k] = np.memmap(self.paths[k], dtype=self.dtype, mode="r",
                                          shape=(int(self.starts[k + 1] - self.starts[k]),))
            offset = int(self.starts[k])
            pieces.append(self._maps[k][start - offset:end - offset])
            start, k = end, k + 1
        if not pieces:
            return np.zeros(0, dtype=self.dtype)
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


def memmap_windows(corpus, seq_len: int, seed: int):
    """The corpus's training windows, in gatelab's order, over `MemmapStream`s."""
    return PackedDataset({d: MemmapStream(corpus.tokens(d, "train")) for d in corpus.domains}, seq_len, seed)


def maps_shards(corpus) -> bool | None:
    """Whether reading a window through gatelab's `TokenStream` leaves a shard mapped into this process (read off
    /proc/self/maps); None without /proc."""
    windows = train_dataset(corpus, 16, 0)
    windows[0]
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    return any(str(path) in maps for path in shard_paths(corpus))


def time_loader(windows, batch_size: int, batches: int, epoch: int, workers: int | None) -> dict:
    """Windows/s of `StepBatches` over steps ``[epoch * batches, (epoch + 1) * batches)``: called directly
    (`workers` None) or through a DataLoader as `TextData` builds it (batch_size=None, `workers` processes)."""
    from gatelab.train.module import StepBatches

    stream = StepBatches(windows, batch_size, batches, epoch * batches)
    gc.collect()
    rss_before = status_kb("VmRSS")
    started = time.perf_counter()
    first_at = None
    count = 0
    if workers is None:
        source: Iterator = (stream.batch(step) for step in range(epoch * batches, (epoch + 1) * batches))
    else:
        source = iter(DataLoader(stream, batch_size=None, num_workers=workers, pin_memory=False))
    for inputs, targets in source:
        assert inputs.shape == (batch_size, windows.seq_len) and inputs.dtype == torch.int64
        count += 1
        if first_at is None:
            first_at = time.perf_counter()
    ended = time.perf_counter()
    rss_after = status_kb("VmRSS")
    steady = (count - 1) * batch_size / (ended - first_at) if count > 1 and ended > first_at else math.nan
    grown = (rss_after - rss_before) * 1024 / 1e6 if rss_before is not None and rss_after is not None else None
    return {"batches": count, "windows": count * batch_size, "seconds": ended - started,
            "first_batch_s": first_at - started, "windows_per_s": count * batch_size / (ended - started),
            "steady_windows_per_s": steady, "rss_growth_mb": grown}


def training_rate(sizes: Sizes, log: Log = print) -> dict:
    """Windows/s the tiny preset's model trains on in fp32 eager on this CPU: a plain forward/backward/AdamW loop
    (`steps.plain_step`), median step of `train_steps` after `train_warmup`."""
    experiment = load_experiment(repo_root() / "experiments" / "tiny.yaml", ["train.precision=32-true"])
    step = plain_step(experiment, "32-true")
    times = time_interleaved({"tiny": step}, sizes.train_warmup, sizes.train_steps)["tiny"]
    step_s = statistics.median(times)
    batch = experiment.train.batch_size
    log(f"training: tiny fp32 plain loop {step_s * 1e3:.0f} ms a step of {batch} windows: "
        f"{batch / step_s:.1f} windows/s")
    return {"step_s": step_s, "steps": len(times), "batch_size": batch, "seq_len": experiment.data.seq_len,
            "windows_per_s": batch / step_s, "tokens_per_s": batch * experiment.data.seq_len / step_s}


def bench_loader(folder: Path, sizes: Sizes, seq_len: int, batch_size: int, seed: int, log: Log = print) -> list[dict]:
    """Loader rows over the synthetic corpus in `folder`: with its shards in the page cache, then evicted from it
    (a fresh corpus object, so no mapping of this process holds pages back), each also with the memory-mapped
    comparison reader."""
    rows, epoch = [], 0

    def measure(label: str, reader: str, cache: str, windows, workers: int | None, batches: int) -> None:
        nonlocal epoch
        epoch += 1
        row = {"loader": label, "reader": reader, "cache": cache,
               **time_loader(windows, batch_size, batches, epoch, workers)}
        rows.append(row)
        log(f"loader: {label}, {reader}, page cache {cache}: {row['windows_per_s']:,.0f} windows/s "
            f"(steady {row['steady_windows_per_s']:,.0f}, first batch {row['first_batch_s'] * 1e3:.0f} ms)")

    corpus = load_synthetic(folder)
    paths = shard_paths(corpus)
    started = time.perf_counter()
    windows = train_dataset(corpus, seq_len, seed)
    build_s = time.perf_counter() - started
    warm_s = warm_page_cache(paths)
    resident = resident_fraction(paths)
    log(f"loader: {len(windows):,} windows of {seq_len + 1} tokens (PackedDataset built in {build_s:.2f} s); "
        f"shards read into the page cache in {warm_s:.1f} s ({fmt(resident)} resident)")
    warm = f"warm ({resident:.0%} resident)" if resident is not None else "warm"
    for label, workers in (("StepBatches.batch", None), ("DataLoader, 0 workers", 0), ("DataLoader, 2 workers", 2)):
        measure(label, GATELAB_READER, warm, windows, workers, sizes.loader_batches)
    alternative = memmap_windows(corpus, seq_len, seed)
    measure("StepBatches.batch", MEMMAP_READER, warm, alternative, None, sizes.loader_batches)
    del windows, corpus, alternative
    gc.collect()

    for label, workers, reader in (("StepBatches.batch", None, GATELAB_READER), ("DataLoader, 2 workers", 2,
                                   GATELAB_READER), ("StepBatches.batch", None, MEMMAP_READER)):
        corpus = load_synthetic(folder)
        windows = (train_dataset(corpus, seq_len, seed) if reader == GATELAB_READER
                   else memmap_windows(corpus, seq_len, seed))
        evicted = evict_page_cache(paths)
        resident = resident_fraction(paths)
        cache = (f"evicted ({resident:.0%} resident)" if resident is not None else "evicted") if evicted else \
            "warm (eviction unavailable)"
        measure(label, reader, cache, windows, workers, sizes.cold_batches)
        del windows, corpus
        gc.collect()
    for row in rows:
        row["packed_dataset_build_s"] = build_s
    return rows


def folio_probe(folder: Path, windows: int = 100) -> list[dict]:
    """How many MB of one shard 100 random windows bring into this process's RSS through a memory map, by how the
    file's pages came into the page cache: freshly written (as a prepare leaves them), read with plain reads, or not
    cached at all; and through os.pread. On kernels that cache file pages in large folios and map a whole folio on a
    fault, a window can map up to 2 MB."""
    source = min((folder / f"{SYNTH_DOMAIN}.train").glob("shard-*.bin"))
    copy = folder / "probe.bin.tmp"
    rows = []
    try:
        with source.open("rb") as f, copy.open("wb") as out:  # a fresh copy, written as a prepare writes
            while chunk := f.read(8 << 20):
                out.write(chunk)
        for state in ("freshly written", "read with plain reads", "not cached", PROBE_PREAD):
            if state == "read with plain reads":
                evict_page_cache([copy])
                warm_page_cache([copy])
            elif state in ("not cached", PROBE_PREAD):
                evict_page_cache([copy])
            rows.append({"state": state, **_probe_windows(copy, windows, pread=state == PROBE_PREAD)})
    finally:
        copy.unlink(missing_ok=True)
    return rows


def _probe_windows(path: Path, count: int, pread: bool) -> dict:
    size = path.stat().st_size // 2
    starts = np.random.default_rng(1).integers(0, size - 300, count)
    before = smaps_rollup()
    started = time.perf_counter()
    if pread:
        fd = os.open(path, os.O_RDONLY)
        for s in starts:
            np.frombuffer(os.pread(fd, 257 * 2, int(s) * 2), dtype=np.uint16).astype(np.int64)
        os.close(fd)
    else:
        tokens = np.memmap(path, dtype=np.uint16, mode="r", shape=(size,))
        for s in starts:
            tokens[s:s + 257].astype(np.int64)
    seconds = time.perf_counter() - started
    after = smaps_rollup()
    result = {"windows": count, "file_mb": path.stat().st_size / 1e6, "seconds": seconds,
              "rss_growth_mb": (after.get("Rss", 0) - before.get("Rss", 0)) / 1e3,
              "file_pmd_mapped_mb": (after.get("FilePmdMapped", 0) - before.get("FilePmdMapped", 0)) / 1e3}
    if not pread:
        del tokens
    return result
