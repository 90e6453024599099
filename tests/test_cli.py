"""The `gatelab` command as a user runs it: real subprocesses, real exit codes, no tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import (
    REPO,
    REPORTS_LIGHTNING,
    in_a_terminal,
    write_files_corpus,
    write_micro_experiment,
    write_sweep,
)


def gatelab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatelab", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120)


@pytest.mark.slow
def test_variants_json_under_the_paper_moe():
    result = gatelab("variants", "--experiment", "experiments/paper-moe-15b.yaml", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["id"]: row for row in json.loads(result.stdout)}
    assert round(rows["g1_elem_sig"]["added_params"] / 1e6) == 201
    assert round(rows["g1_head_sig"]["added_params"] / 1e6, 1) == 1.6
    assert rows["baseline"]["added_params"] == 0


def test_variants_table_lists_every_variant():
    from gatelab.variants import VARIANTS

    result = gatelab("variants")
    assert result.returncode == 0
    assert all(variant in result.stdout for variant in VARIANTS)


def test_moe_only_variant_under_a_dense_preset_is_not_applicable():
    rows = json.loads(gatelab("variants", "--experiment", "experiments/tiny.yaml", "--json").stdout)
    row = next(r for r in rows if r["id"] == "ref_add4experts")
    assert row["added_params"] is None and "moe" in row["not_applicable"]


@pytest.mark.slow
def test_bad_input_is_one_message_and_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: {vocab_size: 8, n_layers: 1, d_model: 8, n_heads: 3, n_kv_heads: 2, head_dim: 4,"
                   " ffn_hidden: 8, qk_nrom: true}\n")
    for args in (["variants", "--experiment", str(bad)], ["variants", "--experiment", "missing.yaml"]):
        result = gatelab(*args)
        assert result.returncode == 2
        assert "Traceback" not in result.stderr and "error:" in result.stderr
    result = gatelab("variants", "--experiment", str(bad))
    assert "qk_nrom: unknown key; did you mean 'qk_norm'" in result.stderr


@pytest.mark.slow
def test_claims_bad_input_writes_nothing(tmp_path):
    out = tmp_path / "claims"
    for args, message in ((["sweeps/missing.yaml"], "sweeps/missing.yaml: no such file"),
                          (["sweeps/repro-core.yaml", "--format", "pdf"], "valid formats: md, csv, latex, html")):
        result = gatelab("claims", *args, "--out", str(out), "--runs-dir", str(tmp_path / "runs"))
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert message in result.stderr
    assert not out.exists()


@pytest.mark.slow
def test_claims_of_a_sweep_with_no_runs_marks_every_claim_not_run(tmp_path):
    out = tmp_path / "claims"
    result = gatelab("claims", "sweeps/repro-sink.yaml", "--out", str(out), "--format", "md,csv",
                     "--runs-dir", str(tmp_path / "runs"))
    assert result.returncode == 0, result.stderr
    markdown = (out / "claims.md").read_text()
    assert "Generated from no ended runs" in markdown and "holds |" not in markdown
    assert markdown.count("| not run ") >= 40
    assert "no MLflow store at" in result.stdout and not (tmp_path / "runs").exists()  # read, never made


# --- issue 16: every failure is one message naming the file, key or URI, and no password ----------------------------


def assert_one_message(result: subprocess.CompletedProcess, code: int, *named: str) -> None:
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert all(name in result.stderr for name in named), result.stderr


@pytest.mark.parametrize("folder", ["[/bold]", "[red]x[/red]", "[final]"])
def test_markup_in_a_path_is_printed_as_written(tmp_path, folder):
    missing = tmp_path / folder / "preset.yaml"
    assert_one_message(gatelab("variants", "--experiment", str(missing)), 2, f"{missing}: no such file")


def test_markup_in_a_table_is_printed_as_written(tmp_path):
    preset = tmp_path / "[red]runs[/red]" / "tiny.yaml"
    preset.parent.mkdir(parents=True)
    preset.write_text((REPO / "experiments" / "tiny.yaml").read_text())
    result = gatelab("variants", "--experiment", str(preset))
    assert result.returncode == 0 and f"under {preset}" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("content, named", [
    (b"name: x\ntrain:\n  lr: 0.001\ntrain:\n  max_steps: 3\n", "key 'train' appears twice in the same mapping, at "
                                                                 "lines 2 and 4"),
    (b"name: caf\xe9\n", "byte 0xe9 at offset 9 (line 1) is not UTF-8"),
    (None, "is a folder"),
], ids=["repeated-key", "not-utf8", "a-folder"])
def test_a_bad_yaml_file_is_one_message_naming_it(tmp_path, content, named):
    preset = tmp_path / "preset.yaml"
    preset.mkdir() if content is None else preset.write_bytes(content)
    assert_one_message(gatelab("variants", "--experiment", str(preset)), 2, f"{preset}: {named}")


def test_an_unreadable_experiment_of_a_sweep_names_it_and_the_sweep(tmp_path):
    sweep = write_sweep(tmp_path, {})
    preset = tmp_path / "presets" / "micro.yaml"
    preset.write_bytes(b"name: caf\xe9\n")
    assert_one_message(gatelab("sweep", "plan", str(sweep)), 2, f"{sweep}: experiment: {preset}: byte 0xe9")


OUT_COMMANDS = {
    "table": ["table", "sweeps/quickstart.yaml", "--format", "md", "--runs-dir"],
    "claims": ["claims", "sweeps/quickstart.yaml", "--format", "md", "--runs-dir"],
    "bench": ["bench", "--steps", "2", "--run-steps", "1", "--scratch"],
}
RUNS_DIR_COMMANDS = {
    "train": ["train", "experiments/tiny.yaml", "--quiet"],
    "sweep run": ["sweep", "run", "sweeps/quickstart.yaml"],
    "sweep worker": ["sweep", "worker", "sweeps/quickstart.yaml", "--storage", "journal.log"],
    "sweep status": ["sweep", "status", "sweeps/quickstart.yaml"],
    "table": ["table", "sweeps/quickstart.yaml"],
    "claims": ["claims", "sweeps/quickstart.yaml"],
    "eval": ["eval", "sweeps/quickstart.yaml", "--tasks", "gatelab_blimp"],
    "ui": ["ui", "sweeps/quickstart.yaml", "--port", "5999"],
}


@pytest.mark.parametrize("command", OUT_COMMANDS)
@pytest.mark.parametrize("case", ["a-file", "read-only", "under-read-only"])
def test_an_out_folder_that_cannot_be_written_is_refused_before_any_work(tmp_path, command, case):
    (tmp_path / "a-file").write_text("kept\n")
    (tmp_path / "read-only").mkdir(mode=0o555)
    out = tmp_path / {"a-file": "a-file", "read-only": "read-only", "under-read-only": "read-only/new"}[case]
    result = gatelab(*OUT_COMMANDS[command], str(tmp_path / "runs"), "--out", str(out))
    assert_one_message(result, 2, f"--out {out}: ")
    assert (tmp_path / "a-file").read_text() == "kept\n" and not any((tmp_path / "read-only").iterdir())
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command", RUNS_DIR_COMMANDS)
def test_a_runs_dir_that_is_a_file_is_refused_before_any_work(tmp_path, command):
    runs = tmp_path / "runs"
    runs.write_text("kept\n")
    result = gatelab(*RUNS_DIR_COMMANDS[command], "--runs-dir", str(runs))
    assert_one_message(result, 2, f"--runs-dir {runs}: is a file")
    assert runs.read_text() == "kept\n" and sorted(tmp_path.iterdir()) == [runs]


RAW_AT_POSTGRES = "postgresql://postgres:hunter@2secret@127.0.0.1:9/test"


def test_a_ledger_uri_password_with_a_raw_at_is_never_printed(tmp_path):
    sweep = write_sweep(tmp_path, {})
    result = gatelab("sweep", "status", str(sweep), "--storage", RAW_AT_POSTGRES, "--runs-dir", str(tmp_path / "runs"))
    assert_one_message(result, 2, "postgres:***@127.0.0.1:9")
    assert "hunter" not in result.stdout + result.stderr and "2secret" not in result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("tracking_uri, secrets", [("http://admin:TopSecret99@127.0.0.1:9", ["TopSecret99"]),
                                                   (RAW_AT_POSTGRES, ["hunter", "2secret"])], ids=["http", "raw-at"])
def test_a_tracking_uri_password_is_never_printed(tmp_path, tracking_uri, secrets):
    experiment = write_micro_experiment(tmp_path, data=write_files_corpus(tmp_path / "corpus"))
    environment = {**os.environ, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "2",
                   "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "gatelab", "train", str(experiment), "--quiet", "--runs-dir",
                             str(tmp_path / "runs"), "--tracking-uri", tracking_uri], capture_output=True, text=True,
                            cwd=tmp_path, env=environment, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in output and "127.0.0.1" in output, output
    assert not [secret for secret in secrets if secret in output], output



@pytest.mark.parametrize("args, message", [
    (["train", "experiments/tiny.yaml", "--set", "train.bogus=1"], "unknown key 'bogus'"),
    (["train", "experiments/tiny.yaml", "--variant", "g9_elem_sig"], "unknown variant 'g9_elem_sig'"),
    (["train", "experiments/missing.yaml"], "experiments/missing.yaml: no such file"),
])
def test_a_bad_train_argument_is_answered_before_lightning_is_imported(args, message):
    result = subprocess.run([sys.executable, "-c", REPORTS_LIGHTNING, *args], capture_output=True, text=True, cwd=REPO,
                            timeout=120)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert "lightning imported: False" in result.stdout


def test_the_command_line_and_what_its_commands_do_import_no_heavy_library():
    """gatelab.cli imports gatelab.app's modules whole: each must leave torch, Lightning, MLflow and the rest to its
    functions, or `gatelab --help` and every typo would wait seconds for them."""
    program = ("import sys, gatelab.cli; heavy = ('torch', 'lightning', 'mlflow', 'optuna', 'numpy', 'pandas', "
               "'matplotlib', 'lm_eval'); print(sorted(name for name in heavy if name in sys.modules))")
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr


@pytest.mark.parametrize("command", ["table", "claims"])
def test_a_value_the_table_cannot_use_ends_in_one_message_and_exit_2(monkeypatch, tmp_path, command):
    """A ValueError from the runs (or the claims file) is a user error: one line, exit code 2, no traceback."""
    from typer.testing import CliRunner

    from gatelab.app import claims as app_claims
    from gatelab.app import report as app_report
    from gatelab.cli import app

    def refuse(*args, **kwargs):
        raise ValueError("ppl/avg of run 7 is not a number")

    monkeypatch.setattr(app_report, "make_report", refuse)
    monkeypatch.setattr(app_claims, "make_claims", refuse)
    result = CliRunner().invoke(app, [command, str(tmp_path / "s.yaml"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "error: ppl/avg of run 7 is not a number" in result.output and "Traceback" not in result.output


HELP_COMMANDS = [(), ("train",), ("variants",), ("table",), ("eval",), ("claims",), ("ui",), ("bench",), ("data",),
                 ("data", "prepare"), ("sweep",), ("sweep", "plan"), ("sweep", "run"), ("sweep", "worker"),
                 ("sweep", "reset"), ("sweep", "status"), ("sweep", "supersede"), ("config",), ("config", "schema"),
                 ("config", "show")]


def help_text(*command: str) -> str:
    """`gatelab ... --help` as a terminal 120 columns wide shows it."""
    code, shown = in_a_terminal([sys.executable, "-m", "gatelab", *command, "--help"])
    assert code == 0, shown
    return shown


def panel_entries(text: str, panel: str) -> list[list[str]]:
    """The rows of a help panel ('Commands', 'Options'), each as its list of screen lines (the box stripped)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("╭─ " + panel))
    entries: list[list[str]] = []
    for line in lines[start + 1:]:
        if line.startswith("╰"):
            break
        body = line.strip("│").rstrip()
        if body[:1] == " " and body[1:2] not in (" ", ""):  # a new row: its name in the first column
            entries.append([body])
        elif entries:
            entries[-1].append(body)
    return entries


@pytest.mark.parametrize("command", HELP_COMMANDS, ids=lambda c: " ".join(c) or "gatelab")
def test_help_shows_flags_as_flags_and_wraps_sentences_only_at_the_edge(command):
    """Flags take no value, so the help shows no type for them (typer 0.29 printed `--json <bool>`); a command's
    description runs on to the panel's edge before it wraps (typer's rich markup kept each docstring line break, so
    the command list broke sentences mid-line: "resumable: run / it again")."""
    text = help_text(*command)
    assert "<bool>" not in text
    if "╭─ Commands" not in text:
        return
    width = max(len(line) for line in text.splitlines() if line.startswith("│")) - 2  # inside the box
    for entry in panel_entries(text, "Commands"):
        for line, following in zip(entry, entry[1:]):
            next_word = following.split()[0]
            assert len(line) + 1 + len(next_word) > width - 1, f"a line broken short of the edge:\n{line}\n{following}"


@pytest.mark.parametrize("args", [(), ("--experiment", "experiments/tiny.yaml")], ids=["plain", "under-tiny"])
def test_variants_fit_a_120_column_terminal_with_every_id_whole(args):
    from gatelab.variants import VARIANTS

    code, shown = in_a_terminal([sys.executable, "-m", "gatelab", "variants", *args])
    assert code == 0, shown
    lines = shown.splitlines()
    assert max(len(line) for line in lines) <= 120
    first_words = {line.split()[0] for line in lines if line.strip()}
    assert set(VARIANTS) <= first_words  # each id whole, at the start of its row: a user copies it from there
    assert "…" not in shown
