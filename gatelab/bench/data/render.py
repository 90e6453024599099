"""data.md and data.json from a DataBenchReport."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path

from gatelab.bench.data.report import GATELAB_READER, MEMMAP_READER, DataBenchReport, fmt
from gatelab.bench.data.tokenizing import TOKENIZER_SAMPLE_BYTES


def to_markdown(report: DataBenchReport) -> str:
    lines = header_and_targets_markdown(report)
    lines += tokenizing_markdown(report.tokenize)
    lines += tokenize_profile_markdown(report.tokenize["profile"])
    lines += loader_markdown(report.scale)
    lines += peak_rss_markdown(report.scale)
    if report.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in report.notes]
    return "\n".join(lines) + "\n"


def header_and_targets_markdown(report: DataBenchReport) -> list[str]:
    m = report.machine
    lines = ["# gatelab data bench", "", f"`{report.command}`", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['torch_threads']} threads), GPU: "
             f"{m['gpu'] or 'none'}, Linux {m.get('kernel', '?')}, block-device read-ahead "
             f"{fmt(m.get('read_ahead_kb'))} kB. Load average (1/5/15 min) {m['load_average_at_start']} at the start, "
             f"{m['load_average_at_end']} at the end: other work shares these cores, so single timings drift. "
             f"Scratch: `{report.scratch}`. Whole bench: {report.seconds:.0f} s.", "",
             "## Targets", "", "| target | measured | limit | holds |", "|---|---|---|---|"]
    for c in report.checks:
        holds = {True: "yes", False: "**no**", None: "not measured"}[c["holds"]]
        lines.append(f"| {c['target']} | {fmt(c['measured'])} | {'≤' if c['at_most'] else '≥'} {c['limit']} | "
                     f"{holds} |")
    return lines


def _seconds(values: list[float], digits: int) -> str:
    return ", ".join(f"{x:.{digits}f}" for x in values)


def tokenizing_markdown(t: dict) -> list[str]:
    sources = ", ".join(f"{k} {v:g} MB" for k, v in t["mb_by_source"].items())
    lines = ["", "## 1. Tokenizing", "",
             f"{t['text_mb']:.1f} MB of real text, {t['documents']:,} documents ({sources}) in {t['parquet_files']} "
             f"parquet file(s) (`id`, `text`); a byte-level BPE of {t['vocab_size']:,} tokens trained here with "
             f"gatelab's trainer on the first {min(t['text_mb'], TOKENIZER_SAMPLE_BYTES / 1e6):.1f} MB "
             f"(`{t['tokenizer']}`), given as `data.tokenizer`. {t['text_tokens']:,} text tokens, "
             f"{t['framed_tokens']:,} with each document's `<|bos|>`/`<|eos|>`.", "",
             "| what | wall s (median) | text tokens/s | / bare | CPU s (median) | CPU / bare CPU |",
             "|---|---|---|---|---|---|",
             f"| gatelab whole prepare (`load_data`, `data.source: files`: parquet → JSONL splits → token shards) | "
             f"{t['whole_prepare_s']:.1f} | {fmt(t['whole_prepare_tokens_per_s'])} | {t['whole_ratio']:.2f} | | |",
             f"| … of which parquet → JSONL split files (`prepare_source`), tokenizer load and checks | "
             f"{t['reading_parquet_to_jsonl_s']:.1f} | | | | |",
             f"| gatelab tokenize stage (`write_split` of every split), {len(t['stage_s'])} runs | "
             f"{statistics.median(t['stage_s']):.1f} | {fmt(t['stage_text_tokens_per_s'])} | **{t['ratio']:.2f}** | "
             f"{statistics.median(t['stage_cpu_s']):.1f} | {1 / t['cpu_ratio']:.2f} |",
             f"| bare `encode_batch` loop, 256 docs a batch, texts in memory, {len(t['bare_s'])} runs | "
             f"{statistics.median(t['bare_s']):.1f} | {fmt(t['bare_tokens_per_s'])} | 1 | "
             f"{statistics.median(t['bare_cpu_s']):.1f} | 1 |", "",
             f"Each run, in the order run (the first gatelab run is inside the whole prepare; then rounds alternate "
             f"which goes first): gatelab tokenize stage {_seconds(t['stage_s'], 1)} s (CPU/wall "
             f"{_seconds(t['stage_cpu_per_wall'], 2)}); bare loop "
             f"{_seconds(t['bare_s'], 1)} s (CPU/wall "
             f"{_seconds(t['bare_cpu_per_wall'], 2)}); 2.0 would be both cores busy. Ratio bare / "
             f"gatelab by round: {_seconds(t['ratio_by_round'], 2)}. gatelab's logged rates "
             f"(framing tokens counted): {', '.join(fmt(x) for x in t['stage_logged_tokens_per_s'])} tokens/s.", "",
             f"Back-to-back pairs on the first {t['paired']['mb']:.1f} MB of the split file "
             f"({t['paired']['documents']:,} documents), gatelab's `write_split` (shards, sha256, unigram counts, "
             f"read-back) against the bare loop, alternating which goes first: gatelab "
             f"{_seconds(t['paired']['gatelab_s'], 2)} s; bare "
             f"{_seconds(t['paired']['bare_s'], 2)} s; ratios "
             f"{_seconds(t['paired']['ratios'], 2)}, median "
             f"**{t['paired']['median_ratio']:.2f}**.", "",
             "gatelab's own log lines, first prepare:", ""]
    return lines + [f"    {line.strip()}" for line in t["logged_lines"]]


def tokenize_profile_markdown(p: dict) -> list[str]:
    """Where the tokenize stage's time goes (`tokenizing.tokenize_profile`)."""
    alternative_step = "ids -> numpy, one read a document"
    total = sum(v for k, v in p["seconds"].items() if k != alternative_step)
    lines = ["", f"Where the tokenize stage's time goes: `_write_shard`'s steps replayed one at a time on the first "
             f"{p['bytes'] / 1e6:.1f} MB of `{p['file']}` ({p['tokens']:,} tokens), with gatelab's own reader "
             "(`shards._batches`); the row in italics is an alternative to the row above it, not in the total.", "",
             "| step | seconds | share |", "|---|---|---|"]
    for name, seconds in p["seconds"].items():
        alternative = name == alternative_step
        lines.append(f"| {f'*{name}*' if alternative else name} | {seconds:.3f} | "
                     f"{'' if alternative else f'{seconds / total:.1%}'} |")
    lines.append(f"| total | {total:.3f} | 100% |")
    return lines


def loader_markdown(s: dict) -> list[str]:
    c, tr, write = s["corpus"], s["training"], s["corpus"]["write"]
    lines = ["", "## 2. Reading at scale", "",
             f"Synthetic corpus in gatelab's shard layout: {c['train_tokens']:,} training tokens, "
             f"{c['documents']:,} documents of 2,048-8,192 tokens (the last of each shard cut to fit), {c['shards']} "
             f"uint16 shards, {c['bytes'] / 1e9:.2f} GB, `{c['folder']}` ("
             + ("cached from an earlier run" if write["cached"] else f"written in {write['seconds']:.0f} s") + "), "
             "read as a `TokenCorpus` through `shards.load_split`.", "",
             f"Training consumes (tiny's model, fp32, batch {tr['batch_size']} × {tr['seq_len']} tokens): plain loop "
             f"{tr['step_s'] * 1e3:.0f} ms a step = {tr['windows_per_s']:.1f} windows/s; Lightning steps in the "
             f"children below: {', '.join(f'{x:.1f}' for x in s['lightning_windows_per_s'])} windows/s. Ratios are "
             f"to the fastest, {s['consumed_windows_per_s']:.1f} windows/s.", "",
             "| loader | reader | page cache | batches | windows/s | steady windows/s | first batch (ms) | "
             "RSS growth (MB) | × training |", "|---|---|---|---|---|---|---|---|---|"]
    for row in s["loader"]:
        lines.append(f"| {row['loader']} | {row['reader']} | {row['cache']} | {row['batches']} | "
                     f"{fmt(row['windows_per_s'])} | {fmt(row['steady_windows_per_s'])} | "
                     f"{row['first_batch_s'] * 1e3:.0f} | {fmt(row['rss_growth_mb'])} | "
                     f"{row['ratio_to_training']:,.0f} |")
    maps = {True: "leaves its shards mapped", False: "maps no shard", None: "n/a"}[s.get("gatelab_maps_shards")]
    lines += ["", f"`{GATELAB_READER}` is gatelab's own reader (read back from /proc/self/maps: it {maps}); "
              f"`{MEMMAP_READER}` is the same `PackedDataset` and `StepBatches` over `np.memmap`s of the shards (how "
              "`TokenStream` read them before it took positioned reads), set beside it for comparison. Rows marked "
              "evicted ran on a fresh corpus object after its shards were dropped from the "
              "page cache (`posix_fadvise(DONTNEED)`; the resident share is read back with `mincore`). Building the "
              f"`PackedDataset` (one epoch's window order): {s['loader'][0]['packed_dataset_build_s']:.2f} s."]
    return lines


def peak_rss_markdown(s: dict) -> list[str]:
    """The children's peak RSS, then the page-cache probe of how much a mapped window costs."""
    lines = ["", "Peak RSS (VmHWM) of a short Lightning training of tiny's model (fp32, `TextData` + `GatedLM`, no "
             "logger or checkpoints), one child process per row:", "",
             "| corpus | reader | page cache before | train tokens | steps | peak RSS (GB) | − small (MB) | "
             "after imports | after corpus + windows | RssAnon at end | RssFile at end | of which 2 MB maps | "
             "step (ms) |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in s["rss"]:
        stage = r["peak_rss_by_stage_gb"]
        name = "real tiny corpus" if r["kind"] == "tiny" else f"synthetic {r['train_tokens']:,}"
        reader = MEMMAP_READER if r["kind"] == "synthetic-memmap" else GATELAB_READER
        lines.append(f"| {name} | {reader} | {r['cache']} | {r['train_tokens']:,} | {r['steps']} | "
                     f"{r['peak_rss_gb']:.3f} | {r['difference_to_small_gb'] * 1e3:+.0f} | "
                     f"{stage['after_imports']:.3f} | {stage['after_corpus_and_windows']:.3f} | "
                     f"{r['rss_anon_gb_at_end']:.3f} | {r['rss_file_gb_at_end']:.3f} | "
                     f"{r['file_pmd_mapped_gb_at_end']:.3f} | {r['median_step_s'] * 1e3:.0f} |")
    lines += ["", "\"Freshly written\" rows train on a fresh copy of the large corpus, written with 8 MiB writes "
              "just before, as `gatelab train` right after its prepare finds the shards. RssFile is file pages mapped "
              "into the process: the shared libraries (about 0.13 GB in every row) and the shards' pages a "
              "memory-mapping reader brought in; clean, shared and reclaimable, but counted in RSS and VmHWM. "
              "How much a window maps depends on how its pages came into the page cache (on kernels that cache files "
              "in large folios and map a whole folio on a fault, up to 2 MB a window): the probe below reads random "
              "windows of a fresh copy of one shard through a memory map, then through `os.pread`.", "",
              "| pages | windows | RSS growth (MB) | of which 2 MB maps (MB) | ms |", "|---|---|---|---|---|"]
    for row in s["folio_probe"]:
        lines.append(f"| {row['state']} | {row['windows']} | {row['rss_growth_mb']:.1f} | "
                     f"{row['file_pmd_mapped_mb']:.1f} | {row['seconds'] * 1e3:.0f} |")
    return lines


def write(report: DataBenchReport, out: Path) -> list[Path]:
    """`out` a .md file (with a .json beside it), or a folder for data.md and data.json."""
    md = out if out.suffix == ".md" else out / "data.md"
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(to_markdown(report))
    js = md.with_suffix(".json")
    js.write_text(json.dumps(asdict(report), indent=2, default=str) + "\n")
    return [md, js]
