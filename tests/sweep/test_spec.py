"""Sweep files -> RunSpecs: every shipped sweep, the expansion semantics, and real malformed files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gatelab.data.identity import spec_hash
from gatelab.errors import GatelabError
from gatelab.sweep.spec import expand, load_sweep, with_values
from gatelab.variants import VARIANTS
from tests.helpers import MOE, REPO, SHIPPED_SWEEPS, write_sweep


def cells(path: Path) -> list[dict]:
    return [spec.cell for spec in expand(load_sweep(path))]


# --- shipped sweeps -------------------------------------------------------------------------------------------------


def test_sweeps_are_shipped():
    names = {path.stem for path in SHIPPED_SWEEPS}
    assert {"smoke", "quickstart", "paper-table1", "paper-table2", "paper-table3-4", "paper-table6",
            "lr-stability"} <= names


@pytest.mark.parametrize("path", SHIPPED_SWEEPS, ids=lambda p: p.stem)
def test_every_shipped_sweep_loads_and_expands(path):
    sweep = load_sweep(path)
    specs = expand(sweep)
    assert specs and sweep.name == path.stem
    assert len({spec.hash for spec in specs}) == len(specs)
    assert all(spec.experiment.name == sweep.name and spec.sweep == sweep.name for spec in specs)
    assert not sweep.duplicates
    header = path.read_text().splitlines()[0]
    assert header.startswith("#"), "each sweep file starts with a comment saying what it reproduces"
    assert "gatelab sweep" in path.read_text() and "--experiment" in path.read_text()


def test_smoke_covers_every_registered_variant():
    sweep = load_sweep(REPO / "sweeps" / "smoke.yaml")
    assert [spec.experiment.variant for spec in expand(sweep)] == list(VARIANTS)


@pytest.mark.parametrize("table, csv_name", [("paper-table1", "paper_table1_moe.csv"),
                                             ("paper-table6", "paper_table6_switchhead.csv")])
def test_paper_sweeps_list_the_papers_rows_in_order(table, csv_name):
    ids = [line.split(",")[0] for line in (REPO / "results" / "paper" / csv_name).read_text().splitlines()[1:]]
    assert [spec.experiment.variant for spec in expand(load_sweep(REPO / "sweeps" / f"{table}.yaml"))] == ids


def test_table3_4_sweep_covers_both_tables():
    paper = REPO / "results" / "paper"
    ids = set()
    for name in ("paper_table3_nonlinearity.csv", "paper_table4_sparsity_sink.csv"):
        ids |= {line.split(",")[0] for line in (paper / name).read_text().splitlines()[1:]}
    variants = {spec.experiment.variant for spec in expand(load_sweep(REPO / "sweeps" / "paper-table3-4.yaml"))}
    assert variants == ids


def test_reproduction_sweeps_have_the_rows_and_seeds_issue_7_asks_for():
    paper = REPO / "results" / "paper"
    ids = set()
    for name in ("paper_table1_moe.csv", "paper_table3_nonlinearity.csv", "paper_table4_sparsity_sink.csv"):
        ids |= {line.split(",")[0] for line in (paper / name).read_text().splitlines()[1:]}
    moe = expand(load_sweep(REPO / "sweeps" / "repro-table1-3-4.yaml"))
    assert {spec.experiment.variant for spec in moe} == ids
    assert all(sorted(s.experiment.seed for s in moe if s.experiment.variant == v) == [0, 1, 2] for v in ids)
    assert all(spec.experiment.model.ffn == "moe" for spec in moe)

    core = expand(load_sweep(REPO / "sweeps" / "repro-core.yaml"))
    seeds: dict[tuple[str, float], list[int]] = {}
    for spec in core:
        seeds.setdefault((spec.experiment.variant, spec.experiment.train.lr), []).append(spec.experiment.seed)
    variants = {"baseline", "g1_elem_sig", "g1_head_sig", "g2_elem_sig", "g5_elem_sig"}
    assert {v for v, _ in seeds} == variants
    assert all(sorted(seeds[v, 2e-3]) == [0, 1, 2, 3, 4] and sorted(seeds[v, 8e-3]) == [0, 1, 2] for v in variants)


def test_experiment_override_replaces_the_preset():
    sweep = load_sweep(REPO / "sweeps" / "paper-table1.yaml", REPO / "experiments" / "paper-moe-15b.yaml")
    specs = expand(sweep)
    assert len(specs) == 15 and sweep.experiment_path.name == "paper-moe-15b.yaml"
    assert all(spec.experiment.model.d_model == 2048 for spec in specs)


def test_shipped_search_sweep_has_a_search_space():
    space = load_sweep(REPO / "sweeps" / "lr-stability.yaml").search
    assert space is not None and space.n_trials == 6 and space.pruner == "median"
    lr = space.params["train.lr"]
    assert lr.type == "float" and lr.log and (lr.low, lr.high) == (1e-3, 3e-2)


# --- expansion semantics --------------------------------------------------------------------------------------------


def test_grid_is_the_product_in_file_order(tmp_path):
    path = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"], "seed": [0, 1, 2]}})
    specs = expand(load_sweep(path))
    assert [(s.experiment.variant, s.experiment.seed) for s in specs] == [
        ("baseline", 0), ("baseline", 1), ("baseline", 2), ("g1_elem_sig", 0), ("g1_elem_sig", 1), ("g1_elem_sig", 2)]
    assert [s.index for s in specs] == list(range(6))
    assert specs[4].label() == "g1_elem_sig s1"


def test_zip_moves_together_and_multiplies_the_grid(tmp_path):
    path = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_head_sig"]},
                                  "zip": {"train.lr": [1.0e-3, 2.0e-3], "train.max_steps": [20, 10]}})
    specs = expand(load_sweep(path))
    assert [(s.experiment.variant, s.experiment.train.lr, s.experiment.train.max_steps) for s in specs] == [
        ("baseline", 1e-3, 20), ("baseline", 2e-3, 10), ("g1_head_sig", 1e-3, 20), ("g1_head_sig", 2e-3, 10)]
    assert specs[1].label() == "baseline s0 train.lr=0.002 train.max_steps=10"


def test_include_adds_cells_and_exclude_drops_partial_matches(tmp_path):
    path = write_sweep(tmp_path, {
        "grid": {"variant": ["baseline", "g1_elem_sig"], "model.n_layers": [2, 3]},
        "exclude": [{"variant": "g1_elem_sig", "model.n_layers": 3}],
        "include": [{"variant": "sandwich_norm", "model.n_layers": 3, "train.lr": "1e-3"}],
    })
    assert cells(path) == [
        {"variant": "baseline", "model.n_layers": 2}, {"variant": "baseline", "model.n_layers": 3},
        {"variant": "g1_elem_sig", "model.n_layers": 2},
        # PyYAML reads 1e-3 as a string; the cell carries the value the config read
        {"variant": "sandwich_norm", "model.n_layers": 3, "train.lr": 0.001},
    ]


def test_exclude_matches_numbers_written_either_way(tmp_path):
    path = write_sweep(tmp_path, {"grid": {"train.lr": [1.0e-3, 2.0e-3]}, "exclude": [{"train.lr": "2e-3"}]})
    assert cells(path) == [{"train.lr": 0.001}]


def test_include_only_sweep_runs_just_the_includes(tmp_path):
    path = write_sweep(tmp_path, {"include": [{"variant": "g1_elem_sig"}, {"seed": 3}]})
    assert [s.label() for s in expand(load_sweep(path))] == ["g1_elem_sig s0", "baseline s3"]


def test_no_axes_is_one_run_of_the_preset(tmp_path):
    specs = expand(load_sweep(write_sweep(tmp_path, {})))
    assert len(specs) == 1 and specs[0].cell == {} and specs[0].experiment.model.n_layers == 2


def test_overrides_apply_to_every_run_and_cells_win(tmp_path):
    overrides = {"train.batch_size": 99, "train.max_steps": 7, "variant": "g1_head_sig"}
    path = write_sweep(tmp_path, {"grid": {"train.batch_size": [4, 8]}, "overrides": overrides})
    specs = expand(load_sweep(path))
    assert [s.experiment.train.batch_size for s in specs] == [4, 8]
    assert all(s.experiment.train.max_steps == 7 and s.experiment.variant == "g1_head_sig" for s in specs)


def test_hashes_are_stable_and_distinct(tmp_path):
    body = {"grid": {"variant": ["baseline", "g1_elem_sig", "g2_elem_sig"], "seed": [0, 1]}}
    first = [s.hash for s in expand(load_sweep(write_sweep(tmp_path, body)))]
    again = [s.hash for s in expand(load_sweep(write_sweep(tmp_path, body, name="copy.yaml")))]
    assert first == again and len(set(first)) == 6
    specs = expand(load_sweep(write_sweep(tmp_path, body)))
    assert all(s.hash == spec_hash(s.experiment) for s in specs)


def test_duplicate_cells_run_once(tmp_path):
    # the preset's own lr is 1e-3, so the first two cells resolve to the same config
    path = write_sweep(tmp_path, {"grid": {"train.lr": [1.0e-3, 2.0e-3]}, "include": [{"seed": 0}]})
    sweep = load_sweep(path)
    assert [s.index for s in expand(sweep)] == [0, 1]
    assert [(d.index, d.same_as) for d in sweep.duplicates] == [(2, 0)]
    assert "cell 2" in str(sweep.duplicates[0]) and "cell 0" in str(sweep.duplicates[0])


def test_with_values_gives_a_new_run(tmp_path):
    spec = expand(load_sweep(write_sweep(tmp_path, {"grid": {"variant": ["g1_elem_sig"]}})))[0]
    trial = with_values(spec, {"train.lr": 0.004})
    assert trial.experiment.train.lr == 0.004 and trial.hash != spec.hash
    assert trial.label() == "g1_elem_sig s0 train.lr=0.004"


def test_sweep_carries_retries_paper_and_name(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path, {"paper": "table3-4", "retries": 0}))
    assert (sweep.retries, sweep.paper, sweep.name) == (0, "table3-4", "t")
    assert load_sweep(write_sweep(tmp_path, {})).retries == 2


def test_loading_creates_no_files(tmp_path, monkeypatch):
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    runs = REPO / "runs"
    before = sorted(runs.rglob("*")) if runs.exists() else None
    for path in SHIPPED_SWEEPS:
        expand(load_sweep(path))
    expand(load_sweep(REPO / "sweeps" / "paper-table1.yaml", REPO / "experiments" / "paper-moe-15b.yaml"))
    assert list(work.iterdir()) == []
    assert (sorted(runs.rglob("*")) if runs.exists() else None) == before


# --- real malformed files -------------------------------------------------------------------------------------------


def error_of(path: Path, experiment: Path | None = None) -> str:
    with pytest.raises(GatelabError) as caught:
        load_sweep(path, experiment)
    return str(caught.value)


def test_unknown_variant_names_file_cell_and_key(tmp_path):
    path = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sg"], "seed": [0, 1]}})
    message = error_of(path)
    assert str(path) in message
    assert "cell 2 {variant: g1_elem_sg, seed: 0}" in message and "the same in cell 3" in message
    assert "variant: unknown variant 'g1_elem_sg'" in message and "did you mean g1_elem_sig" in message
    assert "2 of 4 cells are invalid" in message


def test_typo_in_a_dotted_path_names_file_cell_and_key(tmp_path):
    message = error_of(write_sweep(tmp_path, {"grid": {"train.lrr": [1.0e-3]}}))
    assert str(tmp_path / "sweeps" / "s.yaml") in message
    assert "cell 0 {train.lrr: 0.001}" in message and "did you mean 'train.lr'" in message


def test_typo_in_an_include_names_that_cell(tmp_path):
    message = error_of(write_sweep(tmp_path, {"grid": {"seed": [0, 1]}, "include": [{"model.n_layer": 3}]}))
    assert "cell 2 {model.n_layer: 3}" in message and "did you mean 'model.n_layers'" in message


def test_wrong_type_names_file_cell_and_key(tmp_path):
    message = error_of(write_sweep(tmp_path, {"grid": {"variant": ["baseline"], "train.max_steps": [5, "many"]}}))
    assert "cell 1 {variant: baseline, train.max_steps: many}" in message
    assert "train.max_steps: Input should be a valid integer" in message and "'many'" in message
    assert "cell 0" not in message


def test_empty_axis_names_file_and_key(tmp_path):
    path = write_sweep(tmp_path, {"grid": {"variant": ["baseline"], "seed": []}})
    message = error_of(path)
    assert str(path) in message and "grid.seed: empty list" in message


def test_zip_length_mismatch_names_file_and_keys(tmp_path):
    path = write_sweep(tmp_path, {"zip": {"train.lr": [1.0e-3, 2.0e-3], "seed": [0, 1, 2]}})
    message = error_of(path)
    assert str(path) in message and "zip: lists of different lengths (train.lr: 2, seed: 3)" in message


def test_moe_only_variant_on_a_dense_preset_names_the_cell(tmp_path):
    path = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "ref_add4experts"]}})
    message = error_of(path)
    assert str(path) in message and "cell 1 {variant: ref_add4experts}" in message and "moe" in message
    assert expand(load_sweep(write_sweep(tmp_path, {"grid": {"variant": ["ref_add4experts"]}}, preset=MOE)))


def test_every_bad_cell_is_listed_at_once(tmp_path):
    path = write_sweep(tmp_path, {"grid": {"variant": ["nope", "ref_add4experts"]},
                                  "include": [{"train.max_steps": "many"}]})
    message = error_of(path)
    assert all(f"cell {i}" in message for i in range(3)) and "3 of 3 cells" in message


def test_long_listings_are_capped(tmp_path):
    path = write_sweep(tmp_path, {"grid": {"train.max_steps": [f"bad{i}" for i in range(40)]}})
    message = error_of(path)
    assert len(message.splitlines()) <= 22 and "more problems" in message


def test_bad_overrides_and_excludes_are_refused(tmp_path):
    message = error_of(write_sweep(tmp_path, {"grid": {"seed": [0, 1]}, "overrides": {"train.lrr": 1},
                                              "exclude": [{"sed": 1}, {"seed": 7}]}))
    assert "overrides: train.lrr: unknown key 'lrr'; did you mean 'train.lr'" in message
    assert "exclude[0].sed: not an axis of grid or zip; did you mean 'seed'" in message
    assert "exclude[1] {seed: 7}: matches no run" in message


def test_missing_preset_is_named(tmp_path):
    path = write_sweep(tmp_path, {})
    assert "no such file" in error_of(path, tmp_path / "nope.yaml") and str(path) in error_of(path, tmp_path / "x.yaml")
    no_experiment = tmp_path / "sweeps" / "bare.yaml"
    no_experiment.write_text("name: bare\n")
    assert "experiment: missing" in error_of(no_experiment)


def test_a_key_repeated_in_a_sweep_file_names_the_file_the_key_and_both_lines(tmp_path):
    path = write_sweep(tmp_path, {})
    path.write_text(path.read_text() + "grid:\n  seed: [0, 1]\ngrid:\n  seed: [2]\n")
    assert f"{path}: key 'grid' appears twice in the same mapping, at lines 3 and 5" in error_of(path)


@pytest.mark.parametrize("break_preset, problem", [
    (lambda preset: preset.write_bytes(b"name: caf\xe9\n"), "byte 0xe9 at offset 9 (line 1) is not UTF-8"),
    (lambda preset: (preset.unlink(), preset.mkdir()), "is a folder, not a YAML file"),
    (lambda preset: preset.write_text(preset.read_text() + "seed: 1\n"), "key 'seed' appears twice"),
], ids=["not-utf8", "a-folder", "a-repeated-key"])
def test_an_unreadable_experiment_file_is_named_with_the_sweep_that_names_it(tmp_path, break_preset, problem):
    path = write_sweep(tmp_path, {})
    preset = tmp_path / "presets" / "micro.yaml"
    break_preset(preset)
    message = error_of(path)
    assert message.startswith(f"{path}: experiment: {preset}: {problem}") and "\n" not in message


def test_experiment_key_is_relative_to_the_sweep_file(tmp_path, monkeypatch):
    path = write_sweep(tmp_path, {})
    monkeypatch.chdir(tmp_path / "presets")  # anywhere but the sweep's folder
    assert expand(load_sweep(os.path.relpath(path)))


def test_search_ranges_are_checked_against_every_cell(tmp_path):
    message = error_of(write_sweep(tmp_path, {
        "grid": {"variant": ["baseline"]},
        "search": {"params": {"train.warmup_steps": {"type": "int", "low": -5, "high": 10}}, "n_trials": 2}}))
    assert "search.params.train.warmup_steps: -5, -4, -3, -2, -1 of -5..10" in message and "cell 0" in message
    assert "narrow the range to low: 0, high: 10" in message
    message = error_of(write_sweep(tmp_path, {
        "grid": {"train.lr": [1.0e-3]},
        "search": {"params": {"train.lr": {"type": "float", "low": 0.0, "high": 1.0, "log": True}}, "n_trials": 2}}))
    assert "a log-scale range needs low > 0" in message and "train.lr" in message
    message = error_of(write_sweep(tmp_path, {
        "grid": {"train.lr": [1.0e-3]},
        "search": {"params": {"train.lr": {"type": "float", "low": 1.0e-4, "high": 1.0}}, "n_trials": 2}}))
    assert "search.params.train.lr: also set by grid" in message


def test_every_value_of_an_int_search_range_is_checked_with_the_valid_ones_named(tmp_path):
    """n_heads 4 is divisible by n_kv_heads 1, 2 and 4 only: 3, inside the range 1..4, would fail in training."""
    message = error_of(write_sweep(tmp_path, {
        "grid": {"variant": ["baseline", "g1_elem_sig"], "seed": [0, 1]},
        "search": {"params": {"model.n_kv_heads": {"type": "int", "low": 1, "high": 4}}, "n_trials": 2}}))
    assert message.startswith(str(tmp_path / "sweeps" / "s.yaml")) and "nothing was run" in message
    assert "search.params.model.n_kv_heads: 3 of 1..4 make an invalid run" in message
    assert "choices: [1, 2, 4]" in message and "the same in cells 1, 2, 3" in message


def test_a_bad_choice_among_valid_ones_is_named(tmp_path):
    message = error_of(write_sweep(tmp_path, {
        "search": {"params": {"model.n_kv_heads": {"type": "categorical", "choices": [1, 2, 3]}}, "n_trials": 2}}))
    assert "search.params.model.n_kv_heads: 3 of its choices make an invalid run" in message
    assert "drop them from choices" in message


@pytest.mark.parametrize("metric, hint", [
    ("ppl/avgg", "did you mean 'ppl/avg'?"), ("blimp/acc", "did you mean 'blimp/accuracy'?"), ("ppl/nowhere", ""),
    # the catalogue (gatelab.metrics) holds whole names: a family's name needs its placeholder filled in
    ("long_ppl/x", "did you mean 'long_ppl/x1' or 'long_ppl/x2' or"),
    ("sink_rate/layer", "did you mean 'probe/sink_rate/layer0' or 'probe/sink_rate/layer1'?"), ("probe/{}", ""),
])
def test_a_search_metric_no_run_logs_is_refused_before_anything_runs(tmp_path, metric, hint):
    message = error_of(write_sweep(tmp_path, {
        "search": {"params": {"train.lr": {"type": "float", "low": 1e-4, "high": 1e-2}}, "n_trials": 2,
                   "metric": metric}}))
    assert f"search.metric: '{metric}' is not a metric a run logs" in message and hint in message
    assert "nothing was run" in message


@pytest.mark.parametrize("metric", ["ppl/avg", "bpb/avg", "val/loss", "blimp/accuracy", "probe/f_attn",
                                    "unigram_ppl/avg", "lm_eval/hellaswag/acc_norm", "long_ppl/x4",
                                    "probe/sink_rate/layer1"])
def test_metrics_that_runs_log_are_accepted(tmp_path, metric):
    sweep = load_sweep(write_sweep(tmp_path, {
        "search": {"params": {"train.lr": {"type": "float", "low": 1e-4, "high": 1e-2}}, "n_trials": 2,
                   "metric": metric}}))
    assert sweep.search.metric == metric


def test_the_held_out_domains_of_the_experiment_name_ppl_metrics(tmp_path):
    def loads(metric: str) -> bool:
        try:
            load_sweep(write_sweep(tmp_path, {"overrides": {"data.domains": ["code"]}, "search": {
                "params": {"train.lr": {"type": "float", "low": 1e-4, "high": 1e-2}}, "n_trials": 2,
                "metric": metric}}))
        except GatelabError:
            return False
        return True

    assert loads("ppl/code") and loads("ppl/avg") and loads("val/loss") and not loads("ppl/fiction")


def test_a_long_check_says_how_far_it_is(tmp_path, monkeypatch, capsys):
    from gatelab.sweep import spec

    monkeypatch.setattr(spec, "PROGRESS_AFTER_S", 0.0)
    load_sweep(write_sweep(tmp_path, {"grid": {"seed": [0, 1, 2]}}))
    err = capsys.readouterr().err
    assert "s.yaml: 2 of 3 cells" in err and capsys.readouterr().out == ""


def test_a_quick_check_says_nothing_whoever_spoke_last(tmp_path, monkeypatch, capsys):
    """A library call (a test, a notebook, a launcher's helper) in a process whose earlier command set the clock 30 s
    ago: its sub-second phase is no wait to report (it said 'checking ...: 0 of 1 cells' at once, in a fresh clone's
    suite, in tests/sweep/test_executor.py)."""
    import time

    from gatelab.progress import CommandClock

    monkeypatch.setattr(CommandClock, "last_word", time.monotonic() - 30.0)
    expand(load_sweep(write_sweep(tmp_path, {"grid": {"seed": [0, 1, 2]}})))
    assert capsys.readouterr().err == ""


def test_searched_values_valid_alone_are_checked_together(tmp_path):
    """lr and min_lr each within their ranges can still put min_lr above lr: the corners are checked too."""
    message = error_of(write_sweep(tmp_path, {"search": {"params": {
        "train.lr": {"type": "float", "low": 1.0e-4, "high": 1.0e-2, "log": True},
        "train.min_lr": {"type": "float", "low": 1.0e-5, "high": 1.0e-3, "log": True}}, "n_trials": 2}}))
    assert "search.params: together, {train.lr: 0.0001, train.min_lr: 0.001} make an invalid run" in message
    assert "min_lr (0.001) is above lr (0.0001)" in message and "narrow the ranges" in message


def test_a_tokens_budget_is_refused_where_the_cells_tokenizers_differ(tmp_path):
    budget = {"eval.budget": {"tokens": 10_000}}
    path = write_sweep(tmp_path, {"grid": {"model.vocab_size": [64, 128]}, "overrides": budget})
    with pytest.raises(GatelabError, match="eval.budget.tokens: the cells use 2 tokenizers .* use eval.budget.bytes or "
                                           "eval.budget.documents, the same text under any tokenizer; nothing was run"):
        load_sweep(path)
    shared = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"]}, "overrides": budget})
    assert {spec.experiment.eval.budget.tokens for spec in expand(load_sweep(shared))} == {10_000}
    portable = write_sweep(tmp_path, {"grid": {"model.vocab_size": [64, 128]}, "overrides": {"eval.budget.bytes": 1}})
    assert len(expand(load_sweep(portable))) == 2


def test_a_grid_over_the_cell_limit_is_refused_from_its_axes_before_any_cell_is_made(tmp_path, monkeypatch):
    """A million-cell grid took 85 s to check before it was refused (issue 45): the count comes from the axes' lengths,
    and no cell is made or checked (the expansion fails the test if it runs)."""
    from gatelab.sweep import spec

    def made(*args):
        raise AssertionError("cells were made for a grid refused by its size")

    monkeypatch.setattr(spec, "_cells", made)
    body = {"grid": {"seed": list(range(1000)), "train.lr": [1e-3 * (i + 1) for i in range(100)],
                     "variant": ["baseline", "g1_elem_sig"]}}
    with pytest.raises(GatelabError) as refused:
        load_sweep(write_sweep(tmp_path, body))
    message = str(refused.value)
    assert "grid: 200,000 cells (largest axes: seed 1,000, train.lr 100, variant 2), over the 10,000" in message
    assert "search: block" in message and "split it" in message


def test_a_grid_at_the_cell_limit_is_expanded(tmp_path, monkeypatch):
    from gatelab.sweep import spec

    monkeypatch.setattr(spec, "MAX_CELLS", 4)
    sweep = load_sweep(write_sweep(tmp_path, {"grid": {"seed": [0, 1], "variant": ["baseline", "g1_elem_sig"]}}))
    assert len(expand(sweep)) == 4
    monkeypatch.setattr(spec, "MAX_CELLS", 3)
    with pytest.raises(GatelabError, match="grid: 4 cells"):
        load_sweep(write_sweep(tmp_path, {"grid": {"seed": [0, 1], "variant": ["baseline", "g1_elem_sig"]}}))


def test_a_command_starts_the_progress_clock_so_an_earlier_commands_silence_is_not_its_own(tmp_path, monkeypatch):
    """Commands run in one process (tests, a notebook) once shared the clock: a command 30 s after another said
    "checking ...: 0 of N cells" before its first check, in front of what it had to say (a flaky exact-output test)."""
    import time

    from typer.testing import CliRunner

    from gatelab.cli import app
    from gatelab.progress import CommandClock

    path = write_sweep(tmp_path, {"grid": {"seed": [0, 1, 2]}})
    monkeypatch.setattr(CommandClock, "last_word", time.monotonic() - 30.0)  # an earlier command spoke 30 s ago
    done = CliRunner().invoke(app, ["sweep", "status", str(path), "--runs-dir", str(tmp_path / "runs")])
    assert done.exit_code == 0, done.output
    assert "checking" not in done.output and "of 3 cells" not in done.output
