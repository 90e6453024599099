"""`gatelab data prepare`: the data a run trains on, made once."""

from __future__ import annotations

import sys
from pathlib import Path

from typer import echo


def prepare(preset: Path | None, *, data_dir: Path | None, domains: list[str], set_: list[str]) -> None:
    """With a preset, its corpus, tokenizer and token shards (resumable); without, the built-in corpora (`domains`, or
    all of them)."""
    if preset is not None:
        from gatelab.data.prepare import BarProgress, load_data
        from gatelab.data.resolve import load_experiment

        overrides = list(set_) + ([f"data.data_dir={data_dir}"] if data_dir is not None else [])
        config = load_experiment(preset, overrides)
        bar = BarProgress() if sys.stderr.isatty() else None
        try:
            load_data(config, log=echo, warn=echo, progress=bar)
        finally:
            if bar is not None:
                bar.stop()
        return
    from gatelab.data.corpora import prepare_corpora

    manifest = prepare_corpora(data_dir, domains or None)
    if manifest.missing:
        echo(f"missing domains: {', '.join(manifest.missing)} (see the messages above for how to get them)")
