"""spec_hash: the declared table of keys it reads otherwise than as dumped, and the hashes that table must keep."""

from __future__ import annotations

import pytest

from gatelab.config import ExperimentConfig
from gatelab.config_files import set_dotted
from gatelab.data.identity import HASH_RULES, LeftOutAt, hashed_payload, spec_hash
from gatelab.data.resolve import load_experiment
from tests.helpers import REPO

TINY = REPO / "experiments" / "tiny.yaml"
INPUT_INDEPENDENT_GATE = "model.gates=[{position: g1, input_dependent: false}]"
# spec_hash of tiny.yaml with these overrides, computed before the table replaced the one-off exceptions: a key added
# later hashes as before while it holds the value runs had, and changes the hash once it does not.
GOLDEN_OVERRIDE_HASHES = {
    "as shipped": ([], "02fbd8eb72ce111b"),
    "compile and its mode": (["train.compile=true", "train.compile_mode=reduce-overhead"], "02fbd8eb72ce111b"),
    "storage and loader": (["data.shard_mb=8", "data.loader_workers=3"], "02fbd8eb72ce111b"),
    "tracking": (["tracking.uri=sqlite:///x.db", "tracking.experiment=zz"], "02fbd8eb72ce111b"),
    "o_proj_init_scale at 1": (["model.o_proj_init_scale=1.0"], "02fbd8eb72ce111b"),
    "o_proj_init_scale 0.5": (["model.o_proj_init_scale=0.5"], "e4a6b3a935c456ee"),
    "a gate without scale": (["model.gates=[{position: g1}]"], "7bf36ff0517ac45e"),
    "a scale gate": (["model.gates=[{position: g1, kind: scale, scale: 0.5}]"], "0a53465854cbcf18"),
    "decay without gate logits": (["train.decay_gate_logits=true"], "02fbd8eb72ce111b"),
    "gate logits not decayed": ([INPUT_INDEPENDENT_GATE], "5369ff11021a0e17"),
    "gate logits decayed": ([INPUT_INDEPENDENT_GATE, "train.decay_gate_logits=true"], "c6a8b8adcbdfd687"),
    "lm_eval": (["eval.lm_eval={tasks: [gatelab_blimp]}"], "d7c3f7b3de104f8e"),
    "no blimp": (["eval.blimp=false"], "f5863504f90a3c10"),
    "a hub dataset": (["data.source=hf", "data.hf={dataset: a/b, revision: abc}"], "3977e0503ca0853e"),
}


@pytest.mark.parametrize("case", sorted(GOLDEN_OVERRIDE_HASHES))
def test_keys_added_later_keep_the_hashes_runs_were_recorded_under(case):
    overrides, expected = GOLDEN_OVERRIDE_HASHES[case]
    assert spec_hash(load_experiment(TINY, overrides)) == expected


@pytest.mark.parametrize("entry", HASH_RULES, ids=lambda entry: f"{entry.path}:{type(entry.rule).__name__}")
def test_every_rule_names_a_config_key_and_says_why(entry):
    set_dotted({}, entry.path.replace(".*", ""), None)  # an unknown key (a stale entry) is a GatelabError
    assert entry.why.strip()


def test_a_value_held_by_runs_recorded_earlier_is_the_key_s_default():
    """LeftOutAt keeps old hashes only while the key's default is that value: a new default would move every run."""
    shipped = ExperimentConfig.model_validate({"name": "t", "model": {"vocab_size": 32, "n_layers": 1, "d_model": 16,
                                                                       "n_heads": 4, "n_kv_heads": 2, "head_dim": 4,
                                                                       "ffn_hidden": 8, "gates": [{"position": "g1"}]}})
    dumped = shipped.model_dump(mode="json")
    for entry in HASH_RULES:
        if isinstance(entry.rule, LeftOutAt):
            node = dumped
            for part in entry.path.split("."):
                node = node[0] if part == "*" else node[part]
            assert node == entry.rule.legacy, entry.path


def test_the_payload_leaves_out_where_a_run_is_recorded_and_how_it_is_stored():
    payload = hashed_payload(load_experiment(TINY, ["train.compile=true"]))
    assert "tracking" not in payload and "shard_mb" not in payload["data"] and "loader_workers" not in payload["data"]
    assert payload["train"]["compile"] is False and "compile_mode" not in payload["train"]
    assert "tokenizer" not in payload["data"] and "source" not in payload["data"]  # the trained BPE, built-in text


# issue 33's keys: at their defaults a run keeps its hash (those of GOLDEN_OVERRIDE_HASHES); changed, it gets another.
AT_DEFAULTS = {
    "attention and kv_bias": (["model.attention=softmax", "model.kv_bias=false"], "02fbd8eb72ce111b"),
    "a gate at the model dtype, normal init": (["model.gates=[{position: g1, compute_dtype: model, init: normal}]"],
                                               "7bf36ff0517ac45e"),
}
CHANGED = [["model.attention=off_by_one"], ["model.attention=sigmoid"], ["model.kv_bias=true"],
           ["model.gates=[{position: g1, compute_dtype: float32}]"], ["model.gates=[{position: g1, init: zero}]"],
           ["model.gates=[{position: g1, activation: two_sigmoid}]"]]


@pytest.mark.parametrize("case", sorted(AT_DEFAULTS))
def test_the_attention_and_gate_keys_at_their_defaults_keep_the_hashes(case):
    overrides, expected = AT_DEFAULTS[case]
    assert spec_hash(load_experiment(TINY, overrides)) == expected


def test_the_attention_and_gate_keys_changed_give_each_run_its_own_hash():
    hashes = {spec_hash(load_experiment(TINY, overrides)) for overrides in CHANGED}
    assert len(hashes) == len(CHANGED) and not hashes & {"02fbd8eb72ce111b", "7bf36ff0517ac45e"}
