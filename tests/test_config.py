"""The config tree: every shipped YAML loads; bad keys, values and shapes give one message naming key and choices."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gatelab.config import ATTENTION_KINDS, ExperimentConfig, flatten
from gatelab.config_files import to_yaml
from gatelab.data.identity import spec_hash
from gatelab.data.resolve import load_experiment
from gatelab.errors import GatelabError
from gatelab.model import build_model, resolve_model
from tests.helpers import REPO, write_foreign_tokenizer

PRESETS = sorted((REPO / "experiments").glob("*.yaml"))


@pytest.fixture
def recipe_files(tmp_path, monkeypatch):
    """What a preset of `data.source: files` asks the user to download, made small under a temporary home: a parquet
    shard at each of its globs and a tokenizer.json at its `data.tokenizer`, so the shipped paths themselves load."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("HOME", str(tmp_path))

    def make(path) -> None:
        data = __import__("yaml").safe_load(path.read_text()).get("data", {})
        if data.get("source") != "files":
            return
        for pattern in data["files"]["paths"]:
            shard = Path(pattern.replace("*", "part-0")).expanduser()
            shard.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_pylist([{"id": "doc-0", "text": "a document"}]), shard)
        if data.get("tokenizer", "bpe") != "bpe":
            write_foreign_tokenizer(Path(data["tokenizer"]).expanduser())

    return make


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_every_shipped_experiment_loads_and_round_trips(path, recipe_files):
    recipe_files(path)
    experiment = load_experiment(path)
    if experiment.data.source == "files":  # the recipe's files resolve: a run identity, and the tokenizer's size
        assert len(spec_hash(experiment)) == 16 and experiment.model.vocab_size % 128 == 0
    assert isinstance(experiment, ExperimentConfig)
    assert ExperimentConfig.model_validate(__import__("yaml").safe_load(to_yaml(experiment))) == experiment
    assert resolve_model(experiment).n_layers == experiment.model.n_layers


def test_tiny_presets_build_real_models():
    for name in ("tiny.yaml", "tiny-moe.yaml"):
        model = build_model(resolve_model(load_experiment(REPO / "experiments" / name)))
        assert sum(p.numel() for p in model.parameters()) < 20e6


def _write(tmp_path, text: str):
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path


BASE = """
name: t
model: {vocab_size: 32, n_layers: 1, d_model: 16, n_heads: 4, n_kv_heads: 2, head_dim: 4, ffn_hidden: 8}
"""


def test_unknown_key_suggests_the_right_one(tmp_path):
    path = _write(tmp_path, BASE + "train: {lerning_rate: 0.1}\n")
    with pytest.raises(GatelabError) as error:
        load_experiment(path)
    assert str(path) in str(error.value)
    assert "train.lerning_rate: unknown key" in str(error.value)
    assert "valid keys:" in str(error.value) and "lr" in str(error.value)


def test_wrong_literal_names_the_valid_choices(tmp_path):
    path = _write(tmp_path, BASE.replace("ffn_hidden: 8}", "ffn_hidden: 8, gates: [{position: g6}]}"))
    with pytest.raises(GatelabError, match=r"model.gates.0.position: Input should be 'g1', 'g2', 'g3', 'g4' or 'g5'"):
        load_experiment(path)


def test_heads_not_divisible_names_valid_kv_heads(tmp_path):
    path = _write(tmp_path, BASE.replace("n_heads: 4, n_kv_heads: 2", "n_heads: 6, n_kv_heads: 4"))
    with pytest.raises(GatelabError, match=r"model: n_heads \(6\) must be divisible by n_kv_heads \(4\): "
                                           r"valid n_kv_heads are 1, 2, 3, 6"):
        load_experiment(path)


def test_top_k_larger_than_experts(tmp_path):
    moe = BASE.replace("ffn_hidden: 8}", "ffn: moe, moe: {n_experts: 4, top_k: 6, expert_hidden: 8}}")
    with pytest.raises(GatelabError,
                       match=r"model.moe: top_k \(6\) is larger than n_experts \(4\): valid top_k is 1..4"):
        load_experiment(_write(tmp_path, moe))


def test_flatten_gives_dotted_params():
    flat = flatten(load_experiment(REPO / "experiments" / "tiny.yaml"))
    assert flat["model.n_layers"] == 4 and flat["train.lr"] == 2e-3


# Today's spec hashes of the shipped presets (default variant): a sweep finds its finished runs by hash, so a new config
# key must leave them unchanged while it holds its default (README, run identity).
GOLDEN_SPEC_HASHES = {
    "tiny.yaml": "02fbd8eb72ce111b",
    "tiny-moe.yaml": "dc181b06f0859cce",
    "sink-bb.yaml": "5acad39dc949c976",
    "small.yaml": "7c17bfcd0a674659",
}


@pytest.mark.parametrize("name", sorted(GOLDEN_SPEC_HASHES))
def test_shipped_presets_keep_their_spec_hashes(name):
    from gatelab.data.identity import spec_hash

    assert spec_hash(load_experiment(REPO / "experiments" / name)) == GOLDEN_SPEC_HASHES[name]


def test_an_unknown_attention_kind_names_the_kinds_and_the_closest(tmp_path):
    path = _write(tmp_path, BASE.replace("ffn_hidden: 8}", "ffn_hidden: 8, attention: off-by-one}"))
    with pytest.raises(GatelabError, match=r"model.attention: 'off-by-one' is not one of softmax, off_by_one, "
                                           r"learnable_sink, sigmoid, softpick; did you mean 'off_by_one'\?"):
        load_experiment(path)
    for kind in ("softmax", "off_by_one", "learnable_sink", "sigmoid", "softpick"):
        path = _write(tmp_path, BASE.replace("ffn_hidden: 8}", f"ffn_hidden: 8, attention: {kind}, kv_bias: true}}"))
        assert load_experiment(path).model.attention == kind


def test_the_readme_lists_the_attention_kinds_of_the_config_s_table():
    """The docs name the kinds `model.attention` takes, in the table's order, and each kind has its line of doc."""
    listed = re.search(r"They are `model.attention` \(([^)]*)\)", (REPO / "experiments" / "README.md").read_text())
    assert listed is not None
    assert listed.group(1) == ", ".join(f"`{kind}`" for kind in ATTENTION_KINDS)
    assert all(traits.doc for traits in ATTENTION_KINDS.values())


@pytest.mark.parametrize("gate,message", [
    ("{position: g1, kind: rmsnorm, compute_dtype: float32}", "kind 'rmsnorm' has neither"),
    ("{position: g1, kind: scale, scale: 0.5, init: zero}", "kind 'scale' has neither"),
    ("{position: g1, input_dependent: false, init: zero}", "an input-independent gate's logits always start at zero"),
    ("{position: g1, activation: tanh}", "Input should be 'sigmoid', 'silu', 'ns_sigmoid', 'identity', 'softplus' or "
                                         "'two_sigmoid'"),
])
def test_gate_compute_dtype_and_init_are_checked_with_a_reason(tmp_path, gate, message):
    path = _write(tmp_path, BASE.replace("ffn_hidden: 8}", f"ffn_hidden: 8, gates: [{gate}]}}"))
    with pytest.raises(GatelabError, match="model.gates.0") as error:
        load_experiment(path)
    assert message in str(error.value)


@pytest.mark.parametrize(("assignment", "key", "says"), [
    ("train.lr=.inf", "train.lr", "finite number"),
    ("train.betas=[.nan, 0.95]", "train.betas.0", "finite number"),
    ("train.min_lr=.inf", "train.min_lr", "finite number"),
    ("train.betas=[0.9, 1.5]", "train.betas.1", "less than 1"),
    ("train.min_lr=0.1", "train", "min_lr (0.1) is above lr"),
    ("train.grad_clip=.nan", "train.grad_clip", "finite number"),
    ("eval.blimp_per_paradigm=.inf", "eval.blimp_per_paradigm", "finite number"),
])
def test_a_value_no_setting_can_take_is_refused_naming_its_key(assignment, key, says):
    """Finiteness for every float of every config (`.inf` and `.nan` are YAML floats), AdamW's beta range, and a
    schedule that cannot rise: refused before training, the key named, never an error from inside torch."""
    with pytest.raises(GatelabError) as caught:
        load_experiment(REPO / "experiments" / "tiny.yaml", [assignment])
    assert f"{key}: " in str(caught.value) and says in str(caught.value)


def test_every_config_model_refuses_infinite_and_nan_floats():
    """The finiteness rule is the base model's, so a config class added later has it too."""
    import inspect

    from pydantic import BaseModel

    from gatelab import config
    from gatelab.sweep import spec

    models = [cls for module in (config, spec) for _, cls in inspect.getmembers(module, inspect.isclass)
              if issubclass(cls, BaseModel) and cls.__module__ == module.__name__]
    assert len(models) > 10
    assert all(cls.model_config.get("allow_inf_nan") is False for cls in models), [
        cls.__name__ for cls in models if cls.model_config.get("allow_inf_nan") is not False]


def test_a_quoted_value_is_shortened_in_the_message():
    from gatelab.config import _shortened

    assert _shortened("x" * 50) == "x" * 50
    long = _shortened("y" * 10_000)
    assert long.startswith("y" * 200) and long.endswith("(10,000 characters)") and len(long) < 250


def test_settings_that_make_a_run_meaningless_are_warned_about_with_their_fix():
    from gatelab.config import setting_warnings
    from gatelab.data.resolve import load_experiment

    tiny = load_experiment(REPO / "experiments" / "tiny.yaml")
    assert setting_warnings(tiny) == []  # the shipped preset means what it says
    short = load_experiment(REPO / "experiments" / "tiny.yaml", ["train.max_steps=20", "eval.every_n_steps=50"])
    lines = setting_warnings(short)
    assert any("train.warmup_steps" in line and "--set train.warmup_steps=2" in line for line in lines)
    assert any("eval.every_n_steps (50)" in line for line in lines)
    fixed = load_experiment(REPO / "experiments" / "tiny.yaml", ["train.max_steps=20", "train.warmup_steps=2",
                                                                 "train.log_every=5"])
    assert setting_warnings(fixed) == []


@pytest.mark.parametrize("files", [None, {"paths": ["*.parquet"], "domain_field": "source"}],
                         ids=["preset", "files-domain-field"])
@pytest.mark.parametrize("preset", [p for p in PRESETS if p.name != "small-fineweb.yaml"], ids=lambda p: p.stem)
def test_a_dumped_experiment_reads_back_as_itself(preset, files, tmp_path):
    """What a checkpoint records of its run (and gatelab eval rebuilds the model from): a files source with a
    domain_field dumped its default domain beside it and was refused on reading, so no such run could resume."""
    from gatelab.config_files import read_experiment_tree

    tree = read_experiment_tree(preset)
    if files:
        (tmp_path / "a.parquet").touch()  # the glob must match a file
        files = {**files, "paths": [str(tmp_path / files["paths"][0])]}
        tree["data"] = {**tree.get("data", {}), "source": "files", "files": files}
        tree["data"].pop("domains", None)
    experiment = ExperimentConfig.model_validate(tree)
    again = ExperimentConfig.model_validate(experiment.model_dump(mode="json"))
    assert again == experiment and spec_hash(again) == spec_hash(experiment)


@pytest.mark.parametrize(("assignment", "says"), [
    ("eval.budget={bytes: 1000, tokens: 500}", "eval.budget: give exactly one of documents, bytes, tokens (got bytes, "
                                               "tokens)"),
    ("eval.budget={}", "eval.budget: give exactly one of documents, bytes, tokens (got none)"),
    ("eval.budget={bytes: 0}", "eval.budget.bytes: "),
    ("eval.budget={lines: 10}", "eval.budget.lines: unknown key"),
])
def test_a_bad_evaluation_budget_is_one_message_naming_its_key(assignment, says):
    with pytest.raises(GatelabError) as caught:
        load_experiment(REPO / "experiments" / "tiny.yaml", [assignment])
    assert says in str(caught.value)
    if "exactly one" in says:  # the portable units, and why
        assert "bytes and documents are the same held-out text under any tokenizer" in str(caught.value)


def test_the_evaluation_budget_stays_out_of_the_spec_hash_and_is_named_in_canonical_form():
    default = load_experiment(REPO / "experiments" / "tiny.yaml")
    budgeted = load_experiment(REPO / "experiments" / "tiny.yaml", ["eval.budget.bytes=1000000"])
    assert budgeted.eval.budget is not None and spec_hash(budgeted) == spec_hash(default)
    assert budgeted.eval.budget_name(default.data.seq_len) == "bytes=1000000"
    windows = default.eval.max_windows_per_domain
    assert default.eval.budget_name(default.data.seq_len) == f"windows={windows}x{default.data.seq_len}"
    assert flatten(budgeted)["eval.budget.bytes"] == 1000000


def test_a_bytes_budget_is_refused_for_the_synthetic_task_which_has_no_text():
    with pytest.raises(GatelabError, match="eval.budget.bytes counts the held-out text's UTF-8 bytes.*documents"):
        load_experiment(REPO / "experiments" / "sink-bb.yaml", ["eval.budget.bytes=1000"])
    assert load_experiment(REPO / "experiments" / "sink-bb.yaml", ["eval.budget.documents=64"]).eval.budget.documents
