"""`gatelab bench`: the GPU defaults for the options not given, the options checked against each other, the bench
(gatelab.bench.measure, or with --data gatelab.bench.data) run with its report saved between parts, then the report
written and printed."""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

from typer import echo

from gatelab import progress
from gatelab.app import comma_list, say_written
from gatelab.bench import measure, render
from gatelab.bench.data import measure as data_measure
from gatelab.bench.data import render as data_render
from gatelab.bench.data.report import QUICK, Sizes
from gatelab.errors import GatelabError
from gatelab.host import repo_root


@dataclass(frozen=True)
class BenchOptions:
    """`gatelab bench`'s options, by their parameter names (see its --help)."""

    presets: list[Path] | None
    variants: str
    steps: int
    warmup: int
    lightning_steps: int
    run_steps: int
    bf16_steps: int
    sweep: Path | None
    as_json: bool
    out: Path
    data: bool
    scratch: Path | None
    quick: bool
    parts: str


def bench(options: BenchOptions, *, given: Collection[str], command: str) -> None:
    """`gatelab bench` (with --data, the data bench) from its options, `given` naming those the user gave and
    `command` the command line, for the report. A user error is a GatelabError, raised before anything is measured
    where the options are at fault."""
    log = (lambda message: echo(message, err=True)) if options.as_json else echo
    # as in `gatelab train` (GATELAB_VERBOSE=1 keeps them): no dtype warning from the first compile
    progress.silence_noise()
    if options.data:
        sizes = QUICK if options.quick else Sizes()
        write_and_print(data_render, report=data_measure.bench_data(options.scratch, sizes, log=log), out=options.out,
                        as_json=options.as_json, command=command)
        return
    presets, variants, steps, warmup, lightning_steps = options_with_gpu_defaults(options, given=given, log=log)
    parts = chosen_parts(options.parts)
    chosen_presets = presets if "presets" in given else [repo_root() / p for p in presets]

    def save(report) -> None:  # between parts: a bench cut off by a time limit keeps what it measured
        report.command = command
        render.write(report, options.out)

    report = measure.bench(chosen_presets, comma_list(variants), warmup, steps, lightning_steps, options.run_steps,
                           options.sweep, options.bf16_steps, log=log, parts=parts, save=save)
    write_and_print(render, report=report, out=options.out, as_json=options.as_json, command=command)
    if not options.as_json:  # the targets once more, where the output ends: the tables above scroll them off the screen
        echo("\n" + render.summary_markdown(report), nl=False)


def options_with_gpu_defaults(options: BenchOptions, *, given: Collection[str], log) -> tuple:
    """(presets, variants, steps, warmup, lightning_steps): with CUDA, GPU_DEFAULTS for those not given (said in one
    line); refused where the Lightning blocks would time no step after their warm-up."""
    defaults = {"presets": options.presets or measure.DEFAULT_PRESETS, "variants": options.variants,
                "steps": options.steps, "warmup": options.warmup, "lightning_steps": options.lightning_steps}
    chosen = measure.with_gpu_defaults(defaults, given)
    if changed := [name for name in chosen if chosen[name] != defaults[name]]:
        log("CUDA: GPU defaults for the options not given: " + "; ".join(
            f"{name.replace('_', '-')} {' '.join(chosen[name]) if name == 'presets' else chosen[name]}"
            for name in changed))
    if chosen["lightning_steps"] <= chosen["warmup"] + 1:
        raise GatelabError(f"--lightning-steps ({chosen['lightning_steps']}) must exceed --warmup ({chosen['warmup']}) "
                           "by at least 2: each Lightning block times the steps after its warm-up")
    return tuple(chosen[name] for name in defaults)


def chosen_parts(parts: str) -> list[str]:
    """The parts named in --parts, each one of `measure.PARTS`."""
    chosen = comma_list(parts)
    if unknown := [part for part in chosen if part not in measure.PARTS]:
        raise GatelabError(f"--parts: {', '.join(unknown)} is not one of {', '.join(measure.PARTS)}")
    return chosen


def write_and_print(renderer: ModuleType, *, report, out: Path, as_json: bool, command: str) -> None:
    """A bench report into `out` with `renderer` (`gatelab.bench.render` or `gatelab.bench.data.render`), then as
    JSON or Markdown on stdout."""
    report.command = command
    written = renderer.write(report, out)
    if as_json:
        echo(json.dumps(asdict(report), indent=2, default=str))
        return
    echo(renderer.to_markdown(report))
    say_written(written)
