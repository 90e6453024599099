"""Part 2b of `gatelab bench --data`: the peak RSS (VmHWM) of a short Lightning training of tiny's model, one child
process (`python -m gatelab.bench.data rss ...`) per corpus and page-cache state."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from gatelab.bench.data.loader import memmap_windows
from gatelab.bench.data.synthetic import SYNTH_DOMAIN, load_synthetic
from gatelab.bench.data.system import smaps_rollup, status_kb
from gatelab.errors import GatelabError
from gatelab.host import peak_rss_gb, repo_root
from gatelab.progress import silence_noise

CHILD_MODULE = "gatelab.bench.data"  # `python -m` runs its __main__: `child_main`


def rss_child(kind: str, corpus_dir: str, steps: int) -> dict:
    """In the child: build the corpus, train tiny's model `steps` steps with Lightning, report peak RSS by stage.
    `kind`: tiny (the real corpus, through `load_data`), synthetic, or synthetic-memmap (its windows read by
    `MemmapStream`, the comparison reader)."""
    marks = {"after_imports": None}
    import lightning as L
    import torch  # noqa: F401

    from gatelab.bench.steps import step_timer
    from gatelab.data.datasets import train_dataset
    from gatelab.data.resolve import load_experiment
    from gatelab.model import resolve_model
    from gatelab.train.module import GatedLM, TextData

    silence_noise()
    warnings.filterwarnings("ignore")
    marks["after_imports"] = peak_rss_gb()
    experiment = load_experiment(repo_root() / "experiments" / "tiny.yaml",
                                 ["train.precision=32-true", f"train.max_steps={steps}"])
    corpus, domains = child_corpus(kind, corpus_dir, experiment)
    corpus_tokens = sum(len(corpus.tokens(d, "train")) for d in domains)
    if kind == "synthetic-memmap":
        windows = memmap_windows(corpus, experiment.data.seq_len, experiment.seed)
    else:
        windows = train_dataset(corpus, experiment.data.seq_len, experiment.seed, domains)
    marks["after_corpus_and_windows"] = peak_rss_gb()
    L.seed_everything(experiment.seed, verbose=False)
    module = GatedLM(experiment, resolve_model(experiment))
    timer = step_timer()
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, precision="32-true", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0, use_distributed_sampler=False,
                        gradient_clip_val=experiment.train.grad_clip or None, callbacks=[timer],
                        default_root_dir=os.environ.get("TMPDIR", "/tmp"))
    trainer.fit(module, datamodule=TextData(windows, experiment.train.batch_size, steps))
    step_times = list(np.diff(timer.starts))[1:]
    rollup = smaps_rollup()
    return {"kind": kind, "corpus": corpus_dir, "train_tokens": corpus_tokens, "windows": len(windows),
            "steps": trainer.global_step, "peak_rss_gb": peak_rss_gb(), "peak_rss_by_stage_gb": marks,
            "rss_anon_gb_at_end": (status_kb("RssAnon") or math.nan) * 1024 / 1e9,
            "rss_file_gb_at_end": (status_kb("RssFile") or math.nan) * 1024 / 1e9,
            "file_pmd_mapped_gb_at_end": rollup.get("FilePmdMapped", 0) * 1024 / 1e9,
            "median_step_s": statistics.median(step_times) if step_times else math.nan,
            "batch_size": experiment.train.batch_size}


def child_corpus(kind: str, corpus_dir: str, experiment) -> tuple[object, list[str]]:
    """(corpus, its training domains) of a child: the real tiny corpus through `load_data`, or a synthetic one."""
    if kind == "tiny":
        from gatelab.data.prepare import load_data

        _, corpus, domains = load_data(experiment, log=lambda *_: None, warn=lambda *_: None)
        return corpus, domains
    corpus = load_synthetic(Path(corpus_dir))
    if corpus is None:
        raise GatelabError(f"{corpus_dir}: no whole synthetic corpus")
    return corpus, [SYNTH_DOMAIN]


def run_rss_child(kind: str, corpus_dir: str, steps: int, cache: str, timeout: float = 900) -> dict:
    """One child's report; `cache` names the state its corpus's page cache was put in before it started."""
    command = [sys.executable, "-m", CHILD_MODULE, "rss", kind, corpus_dir, str(steps)]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise GatelabError(f"`{' '.join(command)}` failed ({result.returncode}):\n{result.stderr[-3000:]}")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    report["wall_s"] = time.perf_counter() - started
    report["cache"] = cache
    return report


def prepare_tiny(timeout: float) -> tuple[bool, str]:
    """Whether the real tiny corpus can be had (prepared, or prepared now in a child within `timeout`), and why not."""
    code = ("from gatelab.data.resolve import load_experiment; from gatelab.data.prepare import load_data; "
            "from gatelab.host import repo_root; "
            "load_data(load_experiment(repo_root() / 'experiments' / 'tiny.yaml'), log=lambda *_: None)")
    try:
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                                check=False)
    except subprocess.TimeoutExpired:
        return False, f"preparing it took over {timeout:.0f} s"
    if result.returncode != 0:
        return False, (result.stderr.strip().splitlines() or ["failed"])[-1][:300]
    return True, ""


def child_main(argv: list[str]) -> None:
    """The child process's command line: `rss KIND CORPUS_DIR STEPS`, its report as one JSON line on stdout."""
    if len(argv) == 4 and argv[0] == "rss":
        print(json.dumps(rss_child(argv[1], argv[2], int(argv[3]))))
        return
    raise SystemExit(f"usage: python -m {CHILD_MODULE} rss KIND CORPUS_DIR STEPS (the bench's child process); "
                     "the bench itself is `gatelab bench --data`")
