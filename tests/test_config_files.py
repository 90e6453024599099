"""Config files: YAML read with repeated keys, alias bombs, bad bytes and unreadable files refused in one message naming
the file and line, and `--set` assignments parsed and checked against the config's keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from gatelab.config_files import read_yaml
from gatelab.data.resolve import load_experiment
from gatelab.errors import GatelabError
from tests.test_config import BASE, _write


def test_set_overrides_are_typed_and_checked(tmp_path):
    path = _write(tmp_path, BASE)
    experiment = load_experiment(path, ["train.lr=1e-3", "model.sandwich_norm=true", "variant=g1_head_sig"])
    assert experiment.train.lr == 1e-3 and experiment.model.sandwich_norm and experiment.variant == "g1_head_sig"
    with pytest.raises(GatelabError, match=r"did you mean 'train.lr'"):
        load_experiment(path, ["train.lrr=1"])
    with pytest.raises(GatelabError, match=r"train.max_steps: Input should be a valid integer"):
        load_experiment(path, ["train.max_steps=many"])
    with pytest.raises(GatelabError, match="expected KEY.PATH=VALUE"):
        load_experiment(path, ["train.lr"])


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(GatelabError, match="no such file"):
        load_experiment(tmp_path / "absent.yaml")
    with pytest.raises(GatelabError, match="not valid YAML"):
        load_experiment(_write(tmp_path, "name: [unclosed\n"))
    with pytest.raises(GatelabError, match="expected a mapping"):
        load_experiment(_write(tmp_path, "- a list\n"))


def test_a_key_repeated_at_one_level_names_the_file_the_key_and_both_lines(tmp_path):
    path = _write(tmp_path, "name: x\ntrain:\n  lr: 1.0e-3\nseed: 1\ntrain:\n  max_steps: 3\n")
    with pytest.raises(GatelabError, match=rf"{path}: key 'train' appears twice .* lines 2 and 5"):
        load_experiment(path)
    nested = _write(tmp_path, "name: x\ntrain:\n  lr: 1.0e-3\n  max_steps: 3\n  lr: 2.0e-3\n")
    with pytest.raises(GatelabError, match=r"key 'lr' appears twice .* lines 3 and 5"):
        load_experiment(nested)


def test_a_yaml_merge_key_may_still_be_overridden(tmp_path):
    merged = read_yaml(_write(tmp_path, "base: &base {lr: 1, max_steps: 2}\ntrain:\n  <<: *base\n  lr: 3\n"))
    assert merged["train"] == {"lr": 3, "max_steps": 2}


def test_a_byte_that_is_not_utf8_names_the_file_offset_and_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: x\n# caf\u00e9\n".encode("latin-1"))
    with pytest.raises(GatelabError, match=rf"{path}: byte 0xe9 at offset 13 \(line 2\) is not UTF-8"):
        load_experiment(path)


def test_a_file_that_cannot_be_read_is_one_message_naming_it(tmp_path, monkeypatch):
    with pytest.raises(GatelabError, match=rf"{tmp_path}: is a folder"):
        load_experiment(tmp_path)
    path = _write(tmp_path, "name: x\n")

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "open", denied)  # as root, chmod 000 would still read
    with pytest.raises(GatelabError, match=rf"{path}: cannot be read \(Permission denied\)"):
        load_experiment(path)


def test_a_set_value_that_is_not_yaml_names_the_assignment(tmp_path):
    with pytest.raises(GatelabError, match=r"--set 'train.lr=\[1': not valid YAML"):
        load_experiment(_write(tmp_path, "name: x\n"), ["train.lr=[1"])


def test_a_yaml_alias_bomb_is_refused_at_once_in_one_short_line(tmp_path):
    levels = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [
        f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]  # 9^9 values expanded
    path = tmp_path / "bomb.yaml"
    path.write_text("name: bomb\n" + "\n".join(levels) + "\nmodel: {n_layers: *a8}\n")
    with pytest.raises(GatelabError) as caught:
        read_yaml(path)
    assert str(caught.value).startswith(f"{path}: ") and "aliases" in str(caught.value) and len(str(caught.value)) < 300


def test_a_few_anchors_and_aliases_still_load(tmp_path):
    path = tmp_path / "anchors.yaml"
    path.write_text("base: &base {lr: 0.001, warmup_steps: 10}\ntrain:\n  <<: *base\n  lr: 0.002\nlist: &l [1, 2]\n"
                    "again: [*l, *l]\n")
    data = read_yaml(path)
    assert data["train"] == {"lr": 0.002, "warmup_steps": 10} and data["again"] == [[1, 2], [1, 2]]

