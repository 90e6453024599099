"""`gatelab config show` and `gatelab sweep plan --cell`: the printed experiment is what the run logs and trains (saved
and trained, the same spec hash), each non-default value names where it came from, secrets are printed redacted, and
bad input is one message with exit code 2."""

from __future__ import annotations

import re
from pathlib import Path

import typer
import yaml
from typer.testing import CliRunner

from gatelab import tracking
from gatelab.app.config_show import resolved_config, show, with_sources
from gatelab.cli import app as gatelab_app
from gatelab.sweep.spec import expand, load_sweep
from tests.helpers import sqlite_uri, train_in_process, write_micro_experiment, write_sweep

MODEL_HEADER = "# config/model_resolved.yaml"
CHEAP = ["train.max_steps=2", "train.checkpoint_every=2", "train.log_every=1", "eval.every_n_steps=null",
         "eval.blimp=false"]


def config_show(*args: str):
    """`gatelab config show ARGS` (the lead wires `show` into gatelab.cli's `config` group; here it stands alone)."""
    command = typer.Typer()
    command.command()(show)
    return CliRunner().invoke(command, list(args))


def printed_model(text: str) -> dict:
    """The commented resolved-model block of `config show`'s output, loaded."""
    block = text[text.index(MODEL_HEADER):].splitlines()[1:]
    return yaml.safe_load("\n".join(line.removeprefix("# ") for line in block))


def printed_hash(text: str) -> str:
    return re.search(r"^# spec hash ([0-9a-f]{16}), ", text, re.MULTILINE).group(1)


def test_each_value_names_where_it_came_from_a_set_a_variant_and_the_preset(tmp_path):
    preset = write_micro_experiment(tmp_path)
    config = resolved_config(preset, variant="g1_elem_sig+g2_elem_sig", overrides=["model.n_layers=3"])
    assert config.sources["model.n_layers"] == "--set"
    assert config.sources["variant"] == "--variant"
    assert config.sources["model.d_model"] == config.sources["seed"] == "preset"
    assert "model.tie_embeddings" not in config.sources  # its default, from nowhere
    assert config.model_sources["gates[0]"] == "variant g1_elem_sig"
    assert config.model_sources["gates[1]"] == "variant g2_elem_sig"
    assert config.model_sources["n_layers"] == "--set"
    assert [gate.position for gate in config.model.gates] == ["g1", "g2"]
    text = config_show(str(preset), "--variant", "g1_elem_sig+g2_elem_sig", "--set", "model.n_layers=3").stdout
    assert re.search(r"^  n_layers: 3 +# from --set$", text, re.MULTILINE)
    assert re.search(r"^  d_model: 32 +# from preset$", text, re.MULTILINE)
    assert re.search(r"^# - position: g2 +# from variant g2_elem_sig$", text, re.MULTILINE), text
    assert re.search(r"^  tie_embeddings: true$", text, re.MULTILINE)


def test_a_password_in_the_tracking_uri_is_printed_redacted(tmp_path):
    preset = write_micro_experiment(tmp_path)
    done = config_show(str(preset), "--set", "tracking.uri=postgresql://gatelab:hunter2@db.example:5432/mlflow")
    assert done.exit_code == 0, done.output
    assert "hunter2" not in done.stdout
    assert "uri: postgresql://gatelab:***@db.example:5432/mlflow" in done.stdout
    assert "write it back" in done.stdout  # the note says the saved file needs the password back


def test_the_printed_file_trained_as_it_is_records_the_printed_spec_hash_and_configs(tmp_path):
    """The issue's acceptance: save what `config show` prints, train it, and the run's spec-hash tag is the hash
    printed; what it logs as its experiment, resolved model and parameter count are what was printed."""
    preset = write_micro_experiment(tmp_path)
    done = config_show(str(preset), "--variant", "g1_elem_sig+g2_elem_sig", "--seed", "5",
                       *[word for override in CHEAP for word in ("--set", override)])
    assert done.exit_code == 0, done.output
    saved = tmp_path / "shown.yaml"
    saved.write_text(done.stdout)
    runs = tmp_path / "runs"
    result = train_in_process(saved, runs)  # what `gatelab train shown.yaml` does
    client = tracking.client(sqlite_uri(runs))
    recorded = client.get_run(result.run_id).data
    assert recorded.tags[tracking.SPEC_HASH_TAG] == printed_hash(done.stdout)
    assert f"{int(recorded.params[tracking.TOTAL_PARAMS_PARAM]):,} parameters" in done.stdout
    logged = {name: yaml.safe_load(Path(client.download_artifacts(result.run_id, f"config/{name}", str(tmp_path)))
                                   .read_text()) for name in ("experiment.yaml", "model_resolved.yaml")}
    assert logged["experiment.yaml"] == yaml.safe_load(done.stdout)
    assert logged["model_resolved.yaml"] == printed_model(done.stdout)


def test_a_sweep_cell_prints_the_cell_with_the_sweeps_hash_and_values(tmp_path):
    sweep = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"], "train.lr": [1e-3, 3e-3]},
                                   "overrides": {"train.max_steps": 4}})
    spec = expand(load_sweep(sweep))[3]
    done = CliRunner().invoke(gatelab_app, ["sweep", "plan", str(sweep), "--cell", "3"])
    assert done.exit_code == 0, done.output
    assert printed_hash(done.stdout) == spec.hash
    assert yaml.safe_load(done.stdout) == spec.experiment.model_dump(mode="json")
    for key, value in (("variant", "g1_elem_sig"), ("lr", "0.003"), ("max_steps", "4"), ("name", "t")):
        assert re.search(rf"^ *{key}: {value} +# from sweep$", done.stdout, re.MULTILINE), (key, done.stdout)
    assert re.search(r"^  d_model: 32 +# from preset$", done.stdout, re.MULTILINE)


def test_bad_input_is_one_message_naming_it_and_exit_code_2(tmp_path):
    preset = write_micro_experiment(tmp_path)
    sweep = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"]}})
    for done, named in (
        (config_show(str(preset), "--variant", "g1_elem_sgi"), "unknown variant 'g1_elem_sgi'"),
        (config_show(str(preset), "--set", "model.n_layer=3"), "did you mean 'model.n_layers'?"),
        (config_show(str(tmp_path / "absent.yaml")), "absent.yaml: no such file"),
        (CliRunner().invoke(gatelab_app, ["sweep", "plan", str(sweep), "--cell", "7"]),
         "has no cell 7; its cells run from 0 to 1"),
    ):
        assert done.exit_code == 2, done.output
        assert named in done.output and "Traceback" not in done.output
        assert done.output.startswith("error: ") and not done.stdout.strip()


def test_a_value_over_several_lines_gets_no_comment_and_the_text_loads_the_same():
    text = "name: x\nnote: 'first\n\n  second'\nmodel:\n  n_layers: 2\n"
    marked = with_sources(text, sources={"name": "--set", "note": "preset", "model.n_layers": "preset"})
    assert marked.splitlines()[0].endswith("# from --set") and "# from preset" not in marked.splitlines()[1]
    assert marked.splitlines()[-1].endswith("# from preset")
    assert yaml.safe_load(marked) == yaml.safe_load(text)
