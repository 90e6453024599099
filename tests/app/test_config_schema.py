"""`gatelab config schema`: the committed reference page is the command's output, every key has help, and the JSON
Schema accepts the shipped files and refuses a typo."""

from __future__ import annotations

import json

import pytest
import yaml
from pydantic import Field
from typer.testing import CliRunner

from gatelab.app.config_schema import FILE_KINDS, keys_without_help, model_sections
from gatelab.cli import app
from gatelab.config import StrictModel
from tests.helpers import REPO

REFERENCE_PAGE = REPO / "experiments" / "CONFIG.md"
SHIPPED = {kind: sorted((REPO / folder).glob("*.yaml")) for kind, folder in (("experiment", "experiments"),
                                                                               ("sweep", "sweeps"))}


def gatelab_config(*args: str):
    return CliRunner().invoke(app, ["config", *args])


def test_the_committed_reference_page_is_what_the_command_prints():
    result = gatelab_config("schema")
    assert result.exit_code == 0, result.output
    assert result.stdout == REFERENCE_PAGE.read_text(), (
        "experiments/CONFIG.md is out of date: run `gatelab config schema > experiments/CONFIG.md`")


def test_the_page_has_a_row_for_every_key_of_every_nested_model():
    page = REFERENCE_PAGE.read_text()
    for kind, root in FILE_KINDS.items():
        for path, model in model_sections(root):
            for name in model.model_fields:
                key = f"{path}.{name}" if path else name
                assert f"\n| `{key}` |" in page, f"{kind} key {key} has no row"
    assert "\n| `model.gates[].position` |" in page and "\n| `search.params.<name>.low` |" in page


@pytest.mark.parametrize("kind", FILE_KINDS)
def test_every_key_has_help(kind):
    missing = keys_without_help(FILE_KINDS[kind])
    assert not missing, f"{', '.join(missing)}: give each a one-line Field(description=...), what it does and its unit"


def test_a_key_without_help_is_named_by_its_dotted_path():
    class Item(StrictModel):
        documented: int = Field(1, description="a documented key")
        bare: int = 2

    class Tree(StrictModel):
        items: list[Item] = Field([], description="a list of items")
        by_name: dict[str, Item] = Field({}, description="items by name")
        blank: str = Field("x", description="  ")

    assert keys_without_help(Tree) == ["blank", "items[].bare", "by_name.<name>.bare"]


def test_json_needs_one_kind_of_file():
    result = gatelab_config("schema", "--json")
    assert result.exit_code == 2
    assert "--kind experiment or --kind sweep" in result.output


@pytest.mark.parametrize("kind", FILE_KINDS)
def test_the_json_schema_accepts_the_shipped_files_and_refuses_a_typo(kind):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed (not a gatelab dependency): "
                                                          "`pip install jsonschema` runs this check")
    result = gatelab_config("schema", "--json", "--kind", kind)
    assert result.exit_code == 0, result.output
    validator = jsonschema.Draft202012Validator(json.loads(result.stdout))
    assert SHIPPED[kind]
    for path in SHIPPED[kind]:
        errors = [error.message for error in validator.iter_errors(yaml.safe_load(path.read_text()))]
        assert errors == [], f"{path.name}: {errors}"
    typo = yaml.safe_load(SHIPPED[kind][0].read_text()) | {"nmae": "x"}
    assert not validator.is_valid(typo)
