"""The keys of a sweep YAML file (`SweepFile`) and of its Optuna search block, each checked on its own; what they make
together is checked by `gatelab.sweep.spec`."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt, field_validator, model_validator

from gatelab.config import StrictModel
from gatelab.metrics import PPL_AVG
from gatelab.paper import SWEEP_TABLES

PaperTable = Literal[tuple(SWEEP_TABLES)]  # the paper registry's keys, so a sweep can name only what a report can read
MAX_CHECKED_INTS = 1024  # an int search range wider than this is checked at this many values, its ends included


class SearchParam(StrictModel):
    """One searched key: a float or int range (log-uniform with `log: true`) or a list of `choices`."""

    type: Literal["float", "int", "categorical"] = Field(description="a float or int range, or a list of choices")
    low: float | None = Field(None, description="a range's lowest value")
    high: float | None = Field(None, description="a range's highest value")
    log: bool = Field(False, description="sample a range log-uniformly (needs low > 0)")
    choices: list[Any] | None = Field(None, description="categorical: the values (null, booleans, numbers or strings)")

    @model_validator(mode="after")
    def _check(self) -> SearchParam:
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("a categorical parameter needs a non-empty 'choices' list")
            if self.low is not None or self.high is not None or self.log:
                raise ValueError("'low', 'high' and 'log' are for float and int ranges; categorical takes 'choices'")
            odd = [c for c in self.choices if not (c is None or isinstance(c, bool | int | float | str))]
            if odd:
                raise ValueError(f"choices must be null, booleans, numbers or strings (Optuna's rule), not {odd[0]!r}")
            return self
        if self.choices is not None:
            raise ValueError(f"'choices' is for categorical parameters; a {self.type} parameter takes 'low' and 'high'")
        if self.low is None or self.high is None:
            raise ValueError(f"a {self.type} parameter needs 'low' and 'high'")
        if not self.low < self.high:
            raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
        if self.log and self.low <= 0:
            raise ValueError(f"a log-scale range needs low > 0, got {self.low:g}")
        if self.type == "int" and not (float(self.low).is_integer() and float(self.high).is_integer()):
            raise ValueError(f"an int parameter needs whole low and high, got {self.low:g} and {self.high:g}")
        return self

    def checked_values(self) -> list[Any]:
        """The values checked against every cell before a search starts: every choice, every value of an int range
        (a cross-field rule such as n_heads divisible by n_kv_heads fails inside a range, not only at its ends; up to
        MAX_CHECKED_INTS, beyond which its ends and MAX_CHECKED_INTS values spread over it), a float range's ends. A
        trial whose suggestion is still invalid is failed without training (gatelab.sweep.search)."""
        if self.type == "categorical":
            return list(self.choices or [])
        low, high = int(self.low), int(self.high)
        if self.type == "float":
            return [self.low, self.high]
        if high - low < MAX_CHECKED_INTS:
            return list(range(low, high + 1))
        step = (high - low) / (MAX_CHECKED_INTS - 1)
        return sorted({low + round(step * i) for i in range(MAX_CHECKED_INTS)} | {high})

    def suggest(self, trial: Any, name: str) -> Any:
        """Ask an Optuna trial for a value of this parameter."""
        if self.type == "float":
            return trial.suggest_float(name, self.low, self.high, log=self.log)
        if self.type == "int":
            return trial.suggest_int(name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_categorical(name, self.choices)


class SearchSpace(StrictModel):
    """An Optuna search run once per cell: `n_trials` trials over `params`, scored by a final metric."""

    params: dict[str, SearchParam] = Field(description="dotted experiment key -> its range, e.g. train.lr")
    n_trials: PositiveInt = Field(description="trials (runs) per cell")
    metric: str = Field(PPL_AVG, description="the final metric scored, a name of gatelab.metrics, e.g. long_ppl/x4")
    direction: Literal["minimize", "maximize"] = Field("minimize", description="whether a lower or higher metric wins")
    pruner: Literal["none", "median", "hyperband"] = Field(
        "median", description="Optuna's pruner, stopping unpromising trials early")

    @model_validator(mode="after")
    def _check(self) -> SearchSpace:
        if not self.params:
            raise ValueError("params is empty: name at least one dotted key to search, e.g. train.lr")
        return self

    def suggest(self, trial: Any) -> dict[str, Any]:
        return {key: param.suggest(trial, key) for key, param in self.params.items()}


class RungTokens(StrictModel):
    """How many tokens each rung of a ladder trains on, as one of two rules; either gives train.max_steps."""

    per_parameter: PositiveFloat | None = Field(
        None, description="tokens = this x the baseline's parameters at the rung (Chinchilla: 20)")
    flops: PositiveFloat | None = Field(
        None, description="training FLOPs of the baseline at each rung (the plan's count)")

    @model_validator(mode="after")
    def _one_rule(self) -> RungTokens:
        if (self.per_parameter is None) == (self.flops is None):
            given = "both" if self.per_parameter is not None else "neither"
            raise ValueError(f"{given} of per_parameter and flops given; a ladder's tokens follow one rule: "
                             "{per_parameter: 20} (tokens per parameter) or {flops: 1e15} (FLOPs per run)")
        return self


class Ladder(StrictModel):
    """Model sizes as an axis of a sweep: named rungs (each a set of `model.*` values) crossed with the grid, every run
    of a rung trained for the steps its `tokens` rule gives the baseline model at that rung."""

    rungs: dict[str, dict[str, Any]] = Field(
        description="rung name -> {dotted model.* key: value}, smallest first by convention")
    tokens: RungTokens = Field(description="the rule giving each rung's training tokens")

    @field_validator("rungs")
    @classmethod
    def _named_rungs(cls, rungs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        if len(rungs) < 2:
            raise ValueError(f"{len(rungs)} rung(s); a ladder compares model sizes, so it needs at least 2 "
                             "(e.g. {xs: {model.d_model: 48}, s: {model.d_model: 64}})")
        for name in rungs:
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
                raise ValueError(f"rung '{name}' names a table group: use letters, digits, '_', '.' and '-' only")
        return rungs


class SlurmSettings(StrictModel):
    """How `gatelab sweep run --executor slurm` asks Slurm for its workers: each worker is one task of a job array
    (submitit), and these are its sbatch options. The command line's --slurm-* options override them."""

    partition: str | None = Field(None, description="the partition (sbatch --partition); unset: the default")
    time_min: PositiveInt = Field(24 * 60, description="each worker's time limit in minutes (sbatch --time)")
    gpus_per_worker: int = Field(1, ge=0, description="GPUs per worker (sbatch --gpus-per-node)")
    cpus_per_worker: PositiveInt = Field(4, description="cores per worker (sbatch --cpus-per-task)")
    signal_delay_s: int = Field(
        90, ge=10, description="seconds before the time limit that Slurm warns the task (USR2): it puts its run back "
        "with its checkpoint and is requeued")
    max_requeues: int = Field(
        3, ge=0, description="time-limit requeues per task before it ends (submitit's max_num_timeout); gatelab's "
        "launcher then submits a fresh task while cells are left")
    sbatch: dict[str, str | int | float | bool] = Field(
        {}, description="any other sbatch option, name -> value without the dashes, e.g. {account: lab, qos: "
        "high, mem: 64G, constraint: h100} (submitit's slurm_additional_parameters)")
    setup: list[str] = Field(
        [], description="shell lines run before each worker starts, e.g. module loads or `source .venv/bin/activate` "
        "(submitit's slurm_setup)")

    @field_validator("sbatch")
    @classmethod
    def _sbatch_names(cls, sbatch: dict[str, Any]) -> dict[str, Any]:
        for name in sbatch:
            option = name.replace("_", "-")
            if not re.fullmatch(r"[a-z][a-z0-9-]*", option):
                raise ValueError(f"'{name}' is not an sbatch option name: write it without dashes, e.g. "
                                 "{account: lab, gres: 'gpu:2'}")
            if option in OWN_SBATCH_OPTIONS:
                raise ValueError(f"'{name}' is set by gatelab from the slurm keys or the launch; use "
                                 f"{OWN_SBATCH_OPTIONS[option]} instead")
        return sbatch


# sbatch options gatelab sets itself, and the key that sets each
OWN_SBATCH_OPTIONS = {"partition": "slurm.partition", "time": "slurm.time_min", "array": "--workers",
                      "gpus-per-node": "slurm.gpus_per_worker", "cpus-per-task": "slurm.cpus_per_worker",
                      "signal": "slurm.signal_delay_s", "output": "nothing (gatelab names the logs)",
                      "error": "nothing (gatelab names the logs)", "ntasks-per-node": "train.devices",
                      "job-name": "nothing (the job is named after the sweep)"}


class SweepFile(StrictModel):
    """The keys of a sweep YAML file."""

    name: str = Field(description="names folders (runs/<name>/...) and every run's experiment.name")
    experiment: str | None = Field(
        None, description="a preset, relative to the sweep file's folder; --experiment overrides it")
    description: str | None = Field(None, description="what the sweep is for, in words (not read by gatelab)")
    grid: dict[str, list[Any]] = Field({}, description="axis -> values; the runs are the product of the axes")
    zip: dict[str, list[Any]] = Field(
        {}, description="axis -> values, all the same length, moving together; multiplied with grid")
    include: list[dict[str, Any]] = Field([], description="extra cells, run as given")
    exclude: list[dict[str, Any]] = Field(
        [], description="partial cells: a product cell matching every key given is dropped")
    overrides: dict[str, Any] = Field(
        {}, description="dotted key -> value, applied to every run before the cell's own values")
    paper: PaperTable | None = Field(None, description="the paper table a report compares against")
    search: SearchSpace | None = Field(None, description="an Optuna search run in each cell")
    ladder: Ladder | None = Field(
        None, description="model sizes crossed with the grid, each trained for its tokens rule's steps")
    retries: int = Field(2, ge=0, description="how many times a failed run is retried")
    slurm: SlurmSettings | None = Field(
        None, description="the Slurm job array of `gatelab sweep run --executor slurm`: partition, time, extra sbatch "
        "lines, set-up lines")

    @field_validator("name")
    @classmethod
    def _folder_name(cls, name: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or set(name) == {"."}:
            raise ValueError(f"'{name}' names folders: use letters, digits, '_', '.' and '-' only")
        return name
