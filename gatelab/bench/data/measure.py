"""`bench_data`: every measurement of `gatelab bench --data`, part by part, into one DataBenchReport, and its
targets."""

from __future__ import annotations

import gc
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from gatelab.bench.data.loader import bench_loader, folio_probe, maps_shards, training_rate
from gatelab.bench.data.page_cache import evict_page_cache, fresh_copy, resident_fraction, warm_page_cache
from gatelab.bench.data.peak_rss import prepare_tiny, run_rss_child
from gatelab.bench.data.report import GATELAB_READER, DataBenchReport, Sizes
from gatelab.bench.data.synthetic import SYNTH_DOMAIN, load_synthetic, shard_paths, synthetic_spec, write_synthetic
from gatelab.bench.data.system import load_average, read_ahead_kb
from gatelab.bench.data.tokenizing import bench_tokenize
from gatelab.bench.machine import machine_facts
from gatelab.config import ExperimentConfig
from gatelab.data.corpora import default_data_dir
from gatelab.data.resolve import load_experiment
from gatelab.host import repo_root

Log = Callable[[str], None]


def default_scratch() -> Path:
    return default_data_dir().parent / "bench-data"


def bench_data(scratch: Path | None = None, sizes: Sizes = Sizes(), log: Log = print) -> DataBenchReport:
    """Part 1 (tokenizing), then part 2 (reading at scale: the loader, then peak RSS in child processes), then the
    targets."""
    started = time.perf_counter()
    scratch = Path(scratch or default_scratch()).expanduser().resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    report = DataBenchReport(machine=machine_facts(), sizes=asdict(sizes), scratch=str(scratch))
    report.machine["load_average_at_start"] = load_average()
    report.machine["disk_free_gb_at_start"] = shutil.disk_usage(scratch).free / 1e9
    try:
        report.machine["kernel"] = os.uname().release
        report.machine["read_ahead_kb"] = read_ahead_kb(scratch)
    except OSError:
        pass

    report.tokenize = bench_tokenize(scratch, sizes, log)

    tiny = load_experiment(repo_root() / "experiments" / "tiny.yaml")
    large_dir = scratch / f"synthetic-{sizes.large_tokens}"
    small_dir = scratch / f"synthetic-{sizes.small_tokens}"
    bench_reading(report.scale, tiny, large_dir, small_dir, sizes, log)
    report.scale["rss"] = rss = bench_peak_rss(report, scratch, large_dir, small_dir, sizes, log)
    compare_peak_rss(report.scale, rss, sizes)

    # Consumption: the faster of the plain fp32 loop and the Lightning steps of the children (the stricter ratio).
    scale = report.scale
    lightning_rates = [r["batch_size"] / r["median_step_s"] for r in rss if r["median_step_s"] > 0]
    consumed = max([scale["training"]["windows_per_s"], *lightning_rates])
    scale["consumed_windows_per_s"] = consumed
    scale["lightning_windows_per_s"] = lightning_rates
    for row in scale["loader"]:
        row["ratio_to_training"] = row["windows_per_s"] / consumed
    report.machine["load_average_at_end"] = load_average()
    report.checks = acceptance_checks(report)
    report.seconds = time.perf_counter() - started
    return report


def bench_reading(scale: dict, tiny: ExperimentConfig, large_dir: Path, small_dir: Path, sizes: Sizes,
                  log: Log) -> None:
    """The large and small synthetic corpora (written once), then the loader rows over the large one, the page-cache
    probe and the training rate they are set against, into `scale`."""
    seq_len, batch_size, seed = tiny.data.seq_len, tiny.train.batch_size, tiny.seed
    writes = {}
    for folder, tokens in ((large_dir, sizes.large_tokens), (small_dir, sizes.small_tokens)):
        spec = synthetic_spec(tokens, sizes.heldout_tokens, tiny.model.vocab_size, 0, sizes.shard_tokens)
        writes[str(folder)] = write_synthetic(folder, spec, log)
    large = load_synthetic(large_dir)
    train_split = large.get(SYNTH_DOMAIN, "train")
    large_paths = shard_paths(large)
    scale["corpus"] = {"folder": str(large_dir), "train_tokens": len(train_split.tokens),
                       "documents": len(train_split.doc_starts) - 1, "shards": len(train_split.tokens.paths),
                       "bytes": sum(p.stat().st_size for p in large_paths),
                       "write": writes[str(large_dir)], "small_folder": str(small_dir),
                       "small_train_tokens": sizes.small_tokens}
    del large, train_split
    gc.collect()
    scale["gatelab_maps_shards"] = maps_shards(load_synthetic(large_dir))
    scale["loader"] = bench_loader(large_dir, sizes, seq_len, batch_size, seed, log)
    scale["folio_probe"] = folio_probe(large_dir)
    for row in scale["folio_probe"]:
        log(f"page cache probe: {row['windows']} random windows of a fresh shard copy, {row['state']}: RSS "
            f"+{row['rss_growth_mb']:.1f} MB")
    scale["training"] = training_rate(sizes, log)


def bench_peak_rss(report: DataBenchReport, scratch: Path, large_dir: Path, small_dir: Path, sizes: Sizes,
                   log: Log) -> list[dict]:
    """One child's peak RSS per corpus and page-cache state; the real tiny corpus's too where `sizes.tiny` (or a note
    in `report` where it cannot be prepared)."""
    rss = []
    steps = sizes.rss_steps
    small_paths = shard_paths(load_synthetic(small_dir))
    # The large corpus twice: its shards dropped from the page cache (a first run after a reboot), and a fresh copy
    # whose pages are in the page cache as its writing left them (a run right after its prepare).
    fresh_dir = scratch / f"{large_dir.name}-fresh-copy"
    try:
        for kind, folder, state in (("synthetic", large_dir, "evicted"), ("synthetic", fresh_dir, "freshly written"),
                                    ("synthetic-memmap", fresh_dir, "freshly written"),
                                    ("synthetic", small_dir, "warm")):
            if folder == fresh_dir and kind == "synthetic":  # copied anew: a killed run may have left half a copy
                copy_s = fresh_copy(large_dir, fresh_dir)
                log(f"peak RSS: copied the corpus to {fresh_dir} in {copy_s:.1f} s")
            paths = small_paths if folder == small_dir else shard_paths(load_synthetic(folder))
            if state == "evicted":
                evict_page_cache(paths)
            elif state == "warm":
                warm_page_cache(paths)
            resident = resident_fraction(paths)
            cache = f"{state} ({resident:.0%} resident)" if resident is not None else state
            log(f"peak RSS: {steps} Lightning steps over {folder.name} ({kind}, page cache {cache}), in a child "
                "process")
            rss.append(run_rss_child(kind, str(folder), steps, cache))
    finally:
        shutil.rmtree(fresh_dir, ignore_errors=True)
    if sizes.tiny:
        log("peak RSS: the same over the real tiny corpus (prepared first if it is not)")
        available, why = prepare_tiny(timeout=600)
        if available:
            rss.append(run_rss_child("tiny", "experiments/tiny.yaml data", steps, "as the prepare left it"))
        else:
            report.notes.append(f"The real tiny corpus could not be prepared here ({why}); only the synthetic small "
                                "corpus stands for it.")
    for row in rss:
        log(f"peak RSS: {row['kind']} {row['train_tokens']:,} tokens ({row['cache']}): {row['peak_rss_gb']:.3f} GB "
            f"({row['median_step_s'] * 1e3:.0f} ms a step)")
    return rss


def compare_peak_rss(scale: dict, rss: list[dict], sizes: Sizes) -> None:
    """Each child's peak RSS less the small corpus's (and the real tiny corpus's, where it ran), and the largest of
    those differences over the large corpus's children."""
    small = next(r for r in rss if r["kind"] == "synthetic" and r["train_tokens"] == sizes.small_tokens)
    tiny_row = next((r for r in rss if r["kind"] == "tiny"), None)
    for row in rss:
        row["difference_to_small_gb"] = row["peak_rss_gb"] - small["peak_rss_gb"]
        row["difference_to_tiny_gb"] = row["peak_rss_gb"] - tiny_row["peak_rss_gb"] if tiny_row else None
    gatelab_large = [r for r in rss if r["kind"] == "synthetic" and r["train_tokens"] == sizes.large_tokens]
    for row in rss:
        row["corpus"] = Path(row["corpus"]).name
    scale["rss_difference_gb"] = max(r["difference_to_small_gb"] for r in gatelab_large)
    if tiny_row:
        scale["rss_difference_to_tiny_gb"] = max(r["difference_to_tiny_gb"] for r in gatelab_large)


def acceptance_checks(report: DataBenchReport) -> list[dict]:
    """The data path's targets, each with the figure measured here and whether it holds."""
    rows = []

    def check(target: str, value: float | None, limit: float, at_most: bool, unit: str = "x") -> None:
        holds = None if value is None or not math.isfinite(value) else (value <= limit if at_most else value >= limit)
        rows.append({"target": target, "measured": value, "limit": limit, "at_most": at_most, "unit": unit,
                     "holds": holds})

    t = report.tokenize
    check("tokenize stage tokens/s / bare encode_batch tokens/s (whole corpus, medians of the runs)", t.get("ratio"),
          0.8, at_most=False)
    if t.get("paired"):
        check(f"the same, `write_split` and the bare loop in {t['paired']['pairs']} back-to-back pairs on "
              f"{t['paired']['mb']:.0f} MB (median of the pairs' ratios)", t["paired"]["median_ratio"], 0.8,
              at_most=False)
    scale = report.scale
    for row in scale.get("loader", []):
        if row["reader"] == GATELAB_READER:
            check(f"loader windows/s / training windows/s: {row['loader']}, page cache "
                  f"{row['cache'].split(' (')[0]}",
                  row.get("ratio_to_training"), 20.0, at_most=False)
    for row in scale.get("rss", []):
        if row["kind"] == "synthetic" and row["train_tokens"] == report.sizes["large_tokens"]:
            state, large = row["cache"].split(" (")[0], f"{row['train_tokens']:,}-token corpus"
            check(f"peak RSS, {large} (page cache {state}) - {report.sizes['small_tokens']:,}-token corpus (GB)",
                  row["difference_to_small_gb"], 0.3, at_most=True, unit="GB")
            if row.get("difference_to_tiny_gb") is not None:
                check(f"peak RSS, {large} (page cache {state}) - real tiny corpus (GB)",
                      row["difference_to_tiny_gb"], 0.3, at_most=True, unit="GB")
    return rows
