"""A sweep file's keys and its search block, each refused on its own with a message naming the key."""

from __future__ import annotations

from gatelab.sweep.spec import expand, load_sweep, with_values
from tests.helpers import write_sweep
from tests.sweep.test_spec import error_of


def test_schema_errors_say_did_you_mean(tmp_path):
    message = error_of(write_sweep(tmp_path, {"grdi": {"seed": [0]}}))
    assert "grdi: unknown key; did you mean 'grid'?" in message
    message = error_of(write_sweep(tmp_path, {"paper": "table5"}))
    assert "paper:" in message and "table3-4" in message


def test_bad_sweep_names_are_refused(tmp_path):
    path = write_sweep(tmp_path, {})
    path.write_text(path.read_text().replace("name: t", "name: my sweep/1"))
    assert "name: 'my sweep/1' names folders" in error_of(path)


def test_search_space_suggests_through_optuna(tmp_path):
    import optuna

    path = write_sweep(tmp_path, {"search": {"params": {
        "train.lr": {"type": "float", "low": 1.0e-4, "high": 1.0e-2, "log": True},
        "model.n_layers": {"type": "int", "low": 1, "high": 3},
        "variant": {"type": "categorical", "choices": ["baseline", "g1_elem_sig"]}}, "n_trials": 3}})
    sweep = load_sweep(path)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    values = sweep.search.suggest(study.ask())
    assert 1e-4 <= values["train.lr"] <= 1e-2 and values["model.n_layers"] in (1, 2, 3)
    trial = with_values(expand(sweep)[0], values)
    assert trial.experiment.variant == values["variant"]


def test_a_valid_int_range_loads(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path, {
        "grid": {"seed": [0, 1]},
        "search": {"params": {"train.warmup_steps": {"type": "int", "low": 0, "high": 3000}}, "n_trials": 2}}))
    assert len(sweep.runs) == 2

