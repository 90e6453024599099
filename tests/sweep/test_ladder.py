"""A sweep file's ladder (gatelab.sweep.ladder): rungs crossed with the grid, each rung's steps from its tokens rule,
bad ladders refused before anything runs, and the rungs in `gatelab sweep plan`."""

from __future__ import annotations

import io
import json
import math

import pytest
from rich.console import Console

from gatelab.config import ModelConfig
from gatelab.errors import GatelabError
from gatelab.model.params import count_parameters
from gatelab.sweep.plan import plan_rows, rung_rows
from gatelab.sweep.plan_render import corpus_warnings, plan_json, render_plan
from gatelab.sweep.spec import expand, load_sweep
from tests.helpers import DENSE, REPO, write_sweep

RUNGS = {"a": {"model.d_model": 32, "model.head_dim": 8},
         "b": {"model.d_model": 48, "model.head_dim": 12, "model.n_layers": 3, "model.ffn_hidden": 96}}
GRID = {"variant": ["baseline", "g1_elem_sig"], "seed": [0, 1]}
STEP_TOKENS = DENSE["train"]["batch_size"] * DENSE["data"]["seq_len"]


def ladder_sweep(tmp_path, tokens: dict, **body):
    return write_sweep(tmp_path, {"grid": GRID, "ladder": {"rungs": RUNGS, "tokens": tokens}, **body})


def baseline_parameters(rung: str) -> int:
    model = {**DENSE["model"], **{key.removeprefix("model."): value for key, value in RUNGS[rung].items()}}
    return count_parameters(ModelConfig(**model))


def test_every_rung_runs_the_whole_grid_at_its_size_and_steps(tmp_path):
    specs = expand(load_sweep(ladder_sweep(tmp_path, {"per_parameter": 20})))
    assert [(s.cell["rung"], s.experiment.variant, s.experiment.seed) for s in specs] == [
        (rung, variant, seed) for rung in RUNGS for variant in GRID["variant"] for seed in GRID["seed"]]
    for spec in specs:
        rung = spec.cell["rung"]
        model = spec.experiment.model
        assert (model.d_model, model.head_dim, model.n_layers) == (
            RUNGS[rung]["model.d_model"], RUNGS[rung]["model.head_dim"], RUNGS[rung].get("model.n_layers", 2))
        assert spec.experiment.train.max_steps == math.ceil(20 * baseline_parameters(rung) / STEP_TOKENS)
        assert spec.settings() == {"rung": rung}  # grouped by `gatelab table` like any axis
    assert specs[4].label() == "baseline s0 rung=b"
    assert len({spec.hash for spec in specs}) == len(specs)


def test_every_variant_of_a_rung_trains_the_baselines_steps(tmp_path):
    """A gate's extra parameters buy it no extra tokens: the rule reads the baseline's count."""
    specs = expand(load_sweep(ladder_sweep(tmp_path, {"per_parameter": 20})))
    for rung in RUNGS:
        steps = {spec.experiment.train.max_steps for spec in specs if spec.cell["rung"] == rung}
        assert len(steps) == 1
    assert len({spec.experiment.train.max_steps for spec in specs}) == 2


def test_a_flops_budget_gives_each_rung_the_steps_the_plan_counts(tmp_path):
    budget = 3e9
    specs = expand(load_sweep(ladder_sweep(tmp_path, {"flops": budget})))
    for row, spec in zip(plan_rows(specs), specs):
        if row["variant"] == "baseline":
            per_step = row["flops"] / spec.experiment.train.max_steps
            assert budget <= row["flops"] < budget + per_step  # the fewest whole steps that spend the budget
    steps = {spec.cell["rung"]: spec.experiment.train.max_steps for spec in specs}
    assert steps["a"] > steps["b"]  # the same FLOPs buy the smaller model more steps


def test_yaml_scientific_notation_is_a_budget(tmp_path):
    """PyYAML reads `1e15` as a string (YAML 1.1); the ladder reads it as the number it means."""
    path = ladder_sweep(tmp_path, {"flops": 1})
    path.write_text(path.read_text().replace("flops: 1", "flops: 3e9"))
    assert load_sweep(path).ladder.tokens.flops == 3e9


def test_exclude_and_include_name_a_rung(tmp_path):
    path = ladder_sweep(tmp_path, {"per_parameter": 10}, exclude=[{"rung": "b", "variant": "g1_elem_sig"}],
                        include=[{"rung": "b", "variant": "g1_head_sig", "seed": 0}])
    specs = expand(load_sweep(path))
    assert [spec.label() for spec in specs if spec.cell["rung"] == "b"] == [
        "baseline s0 rung=b", "baseline s1 rung=b", "g1_head_sig s0 rung=b"]
    assert len({spec.experiment.train.max_steps for spec in specs if spec.cell["rung"] == "b"}) == 1


def test_a_grid_key_the_rungs_leave_alone_changes_the_count_the_rule_reads(tmp_path):
    path = write_sweep(tmp_path, {"grid": {"train.batch_size": [2, 4]},
                                  "ladder": {"rungs": RUNGS, "tokens": {"per_parameter": 20}}})
    steps = [spec.experiment.train.max_steps for spec in expand(load_sweep(path))]
    assert steps[0] == 2 * steps[1] or steps[0] == 2 * steps[1] - 1  # twice the batch, half the steps (ceil)


BAD_LADDERS = [
    ({"rungs": RUNGS, "tokens": {"per_parameter": 20}, "fit": "power"}, "fit"),
    ({"rungs": {**RUNGS, "c": {"train.lr": 0.01}}, "tokens": {"per_parameter": 20}},
     "ladder.rungs.c.train.lr: a rung sets the model's size, model.* keys only"),
    ({"rungs": {**RUNGS, "c": {"model.d_modle": 64}}, "tokens": {"per_parameter": 20}},
     "ladder.rungs.c.model.d_modle: unknown key 'd_modle'; did you mean 'model.d_model'?"),
    ({"rungs": RUNGS, "tokens": {}}, "neither of per_parameter and flops given"),
    ({"rungs": RUNGS, "tokens": {"per_parameter": 20, "flops": 1e12}}, "both of per_parameter and flops given"),
    ({"rungs": RUNGS, "tokens": {"per_parameter": -1}}, "greater than 0"),
    ({"rungs": {"a": RUNGS["a"]}, "tokens": {"per_parameter": 20}}, "a ladder compares model sizes, so it needs at "
                                                                    "least 2"),
    ({"rungs": {**RUNGS, "c": dict(RUNGS["a"])}, "tokens": {"per_parameter": 20}},
     "ladder.rungs.c: the same model values as rung a"),
    ({"rungs": {"a b": RUNGS["a"], "c": RUNGS["b"]}, "tokens": {"per_parameter": 20}}, "rung 'a b' names a table"),
]


@pytest.mark.parametrize("ladder, problem", BAD_LADDERS, ids=lambda value: str(value)[:30])
def test_a_bad_ladder_is_refused_with_one_message_naming_file_and_key(tmp_path, ladder, problem):
    path = write_sweep(tmp_path, {"grid": GRID, "ladder": ladder})
    with pytest.raises(GatelabError) as caught:
        load_sweep(path)
    message = str(caught.value)
    assert message.startswith(str(path)) and problem in message
    assert "ladder" in message


CONFLICTS = [
    ({"grid": {**GRID, "train.max_steps": [10, 20]}}, "grid.train.max_steps: the ladder's tokens rule (20 tokens a "
                                                       "parameter) sets each rung's steps"),
    ({"overrides": {"train.max_steps": 10}}, "overrides.train.max_steps: the ladder's tokens rule"),
    ({"include": [{"rung": "a", "train.max_steps": 5}]}, "include[0].train.max_steps: the ladder's tokens rule"),
    ({"grid": {**GRID, "model.d_model": [32, 64]}}, "grid.model.d_model: also set by ladder rung(s) a, b"),
    ({"grid": {**GRID, "rung": ["a"]}}, "grid.rung: ladder.rungs is the rung axis already"),
    ({"include": [{"variant": "g1_head_sig"}]}, "include[0].rung: missing; every run of a ladder names its rung (one "
                                                "of a, b)"),
    ({"include": [{"rung": "c"}]}, "include[0].rung: 'c' is not a rung (one of a, b)"),
    ({"search": {"params": {"model.n_layers": {"type": "int", "low": 2, "high": 3}}, "n_trials": 2}},
     "search.params.model.n_layers: also set by ladder rung(s) b"),
]


@pytest.mark.parametrize("body, problem", CONFLICTS, ids=lambda value: str(value)[:30])
def test_a_key_the_ladder_decides_set_elsewhere_is_refused(tmp_path, body, problem):
    path = ladder_sweep(tmp_path, {"per_parameter": 20}, **body)
    with pytest.raises(GatelabError, match="invalid sweep") as caught:
        load_sweep(path)
    assert str(caught.value).startswith(str(path)) and problem in str(caught.value)


def test_a_rung_without_a_ladder_is_refused(tmp_path):
    path = write_sweep(tmp_path, {"include": [{"rung": "a"}]})
    with pytest.raises(GatelabError, match=r"include\[0\].rung: there is no ladder: block"):
        load_sweep(path)


def test_a_rung_whose_model_is_invalid_names_the_rung_and_the_key(tmp_path):
    rungs = {**RUNGS, "c": {"model.n_kv_heads": 3}}  # 4 query heads
    path = write_sweep(tmp_path, {"grid": GRID, "ladder": {"rungs": rungs, "tokens": {"per_parameter": 20}}})
    with pytest.raises(GatelabError) as caught:
        load_sweep(path)
    assert "{rung: c, variant: baseline, seed: 0}" in str(caught.value) and "n_kv_heads" in str(caught.value)


# --- gatelab sweep plan ---------------------------------------------------------------------------------------------


def test_the_plan_shows_each_runs_rung_and_a_line_per_rung(tmp_path):
    specs = expand(load_sweep(ladder_sweep(tmp_path, {"per_parameter": 20})))
    rows = plan_rows(specs)
    assert [row["rung"] for row in rows] == [spec.cell["rung"] for spec in specs]
    rungs = rung_rows(rows)
    assert [(r["rung"], r["runs"], r["baseline_params"]) for r in rungs] == [
        (rung, 4, [baseline_parameters(rung)]) for rung in RUNGS]
    assert all(r["tokens_per_parameter"][0] >= 20 for r in rungs)  # whole steps: at least the rule's tokens
    assert sum(r["seconds"] for r in rungs) == pytest.approx(sum(row["seconds"] for row in rows))
    out = io.StringIO()
    render_plan(rows, title="t", console=Console(file=out, width=200), workers=2)
    text = out.getvalue()
    assert text.count("rung=a") == 4 and text.count("rung=b") == 4
    assert "ladder rungs" in text and "tokens a parameter" in text and "on 2 workers" in text
    assert [r["rung"] for r in json.loads(json.dumps(plan_json(rows)))["rungs"]] == list(RUNGS)


def test_a_ladder_that_repeats_its_corpus_is_told_to_lower_its_tokens_rule(tmp_path):
    # a generated corpus, counted exactly: the preset's text corpora may not be prepared on this machine
    generated = {"data.task": "bigram_backcopy", "data.bigram_backcopy.train_sequences": 10}
    specs = expand(load_sweep(ladder_sweep(tmp_path, {"per_parameter": 1e6}, overrides=generated)))
    rows = plan_rows(specs)
    assert "lower ladder.tokens" in "\n".join(corpus_warnings(rows, specs))


def test_a_plan_without_a_ladder_has_no_rungs(tmp_path):
    rows = plan_rows(expand(load_sweep(write_sweep(tmp_path, {"grid": GRID}))))
    assert rung_rows(rows) == [] and "rungs" not in plan_json(rows)


# --- the shipped ladders --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, preset", [("ladder-g1", "tiny.yaml"), ("ladder-g1-gpu", "small.yaml")])
def test_the_shipped_ladders_cross_three_variants_and_seeds_with_their_rungs(name, preset):
    sweep = load_sweep(REPO / "sweeps" / f"{name}.yaml")
    assert sweep.experiment_path.name == preset and sweep.ladder is not None and len(sweep.ladder.rungs) >= 3
    specs = expand(sweep)
    assert len(specs) == len(sweep.ladder.rungs) * 3 * 3
    assert {spec.experiment.variant for spec in specs} == {"baseline", "g1_elem_sig", "g1_head_sig"}
    by_rung: dict[str, set[int]] = {}
    for spec in specs:
        by_rung.setdefault(spec.cell["rung"], set()).add(spec.experiment.train.max_steps)
    assert list(by_rung) == list(sweep.ladder.rungs) and all(len(steps) == 1 for steps in by_rung.values())
