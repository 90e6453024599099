"""The variant registry: every gating variant of the paper, by stable id, as data.

A variant is the baseline plus named changes: gates to add to every attention layer, and model fields to change, each
a `Change` or a value to set (`Scale`/`Add` are relative to the experiment's base model, so `ref_kv8` doubles the KV
heads of any preset, as 4 -> 8 does at the paper's scale). Nothing else in gatelab branches on a variant id;
everything reads this table.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from gatelab.config import GateConfig, ModelConfig, SwitchHeadConfig, format_validation_error
from gatelab.errors import GatelabError
from gatelab.paper import TABLES


class Change:
    """What a variant does to a model field: changes `parent[leaf]`, the field at its path, in the model's tree."""

    def apply_to(self, model: dict[str, Any], parent: dict[str, Any], leaf: str) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class SetTo(Change):
    """Set a model field to `value` (a sub-config: to its fields); `Variant` wraps a value the registry writes alone."""

    value: Any

    def apply_to(self, model: dict[str, Any], parent: dict[str, Any], leaf: str) -> None:
        parent[leaf] = self.value.model_dump() if isinstance(self.value, BaseModel) else self.value


@dataclass(frozen=True)
class Scale(Change):
    """Multiply a model field by `factor` (rounded to an integer)."""

    factor: float

    def apply_to(self, model: dict[str, Any], parent: dict[str, Any], leaf: str) -> None:
        parent[leaf] = max(1, round(parent[leaf] * self.factor))


@dataclass(frozen=True)
class Add(Change):
    """Add `amount` to a model field."""

    amount: int

    def apply_to(self, model: dict[str, Any], parent: dict[str, Any], leaf: str) -> None:
        parent[leaf] += self.amount


@dataclass(frozen=True)
class WidenByG1Gate(Change):
    """Widen the FFN by the parameters of an elementwise G1 gate: the gate adds d_model x (n_heads head_dim) weights a
    layer and a SwiGLU column 3 d_model, so a dense SwiGLU gets n_heads head_dim / 3 columns a layer and, in an MoE
    model, each of the E routed experts a 1/E share of them (rounded, at least one)."""

    def apply_to(self, model: dict[str, Any], parent: dict[str, Any], leaf: str) -> None:
        columns = model["n_heads"] * model["head_dim"] / 3
        if model.get("ffn") == "moe":
            model["moe"]["expert_hidden"] += max(1, round(columns / model["moe"]["n_experts"]))
        else:
            model["ffn_hidden"] += round(columns)


@dataclass(frozen=True)
class PaperRow:
    table: str  # a key of gatelab.paper.TABLES: "table1" .. "table6"
    row: str  # the paper's row label, e.g. "(5)"

    def __post_init__(self) -> None:
        if self.table not in TABLES:
            raise ValueError(f"PaperRow.table: {self.table!r} is not one of {', '.join(TABLES)}")


@dataclass(frozen=True)
class Variant:
    id: str
    summary: str
    formula: str
    paper_rows: tuple[PaperRow, ...] = ()
    gates: tuple[GateConfig, ...] = ()
    model_changes: dict[str, Any] = field(default_factory=dict)  # dotted ModelConfig path -> a Change, or a value
    note: str = ""
    reference: str = ""  # where the variant comes from; empty: the paper (Qiu et al. 2025), or a control of gatelab's

    def __post_init__(self) -> None:
        changes = {path: c if isinstance(c, Change) else SetTo(c) for path, c in self.model_changes.items()}
        object.__setattr__(self, "model_changes", changes)

    def citation(self) -> str:
        if self.reference:
            return self.reference
        return "Qiu et al. 2025" if self.paper_rows else "gatelab control"

    def axes(self) -> dict[str, str]:
        """The paper's design axes and the attention kind, for listings and tables."""
        attention = str(self.model_changes.get("attention", SetTo("softmax")).value)
        if self.model_changes.get("kv_bias", SetTo(False)).value:
            attention += "+kv_bias"
        if not self.gates:
            return {"position": "-", "granularity": "-", "heads": "-", "form": "-", "activation": "-", "input": "-",
                    "attention": attention}
        gate = self.gates[0]
        if gate.kind != "gate":
            return {"position": gate.position, "granularity": "elementwise", "heads": "-", "form": "-",
                    "activation": gate.kind, "input": "none", "attention": attention}
        activation = gate.activation + (" fp32" if gate.compute_dtype == "float32" else "") + \
            (" zero-init" if gate.init == "zero" else "")
        return {
            "position": "+".join(g.position for g in self.gates),
            "granularity": gate.granularity,
            "heads": gate.heads,
            "form": gate.form,
            "activation": activation,
            "input": "hidden state" if gate.input_dependent else "none",
            "attention": attention,
        }


def _gate(position: str, **fields: Any) -> GateConfig:
    return GateConfig(position=position, **fields)


def _t(table: int, *rows: int) -> tuple[PaperRow, ...]:
    return tuple(PaperRow(f"table{table}", f"({r})") for r in rows)


_Y = "Y'_{t,i}"
_VIRTUAL_SLOT = ("Fast path: SDPA's fused kernel (flash on a GPU), the {slot} a position prepended to K and V with a "
                 "dummy query prepended to Q, so the call stays causal without a mask: T+1 positions, q, k and v "
                 "copied once. Not Y * sigmoid(lse - b): torch's fused kernels return the log-sum-exp without a "
                 "gradient (gatelab.model.attention_kinds).")
_EXPLICIT = ("No fused kernel in torch: training writes the (B, H, T, T) weights out, as the probes' explicit path "
             "does (fp32, a few such tensors kept per layer for the backward; 3.2 GB each at small.yaml's 64 x 1024 "
             "tokens and 12 heads), so the micro-batch must shrink; it makes no SDPA call (Attention.uses_sdpa is "
             "false).")
VARIANTS: dict[str, Variant] = {
    v.id: v
    for v in [
        Variant("baseline", "no gate", "O = concat(Y) W_O",
                _t(1, 1) + _t(3, 1) + _t(4, 1) + _t(6, 1) + _t(2, 1, 3, 5, 6, 11, 12)),
        Variant("ref_kv8", "parameter reference: twice the KV heads (4 -> 8 at paper scale)", "k -> 2k",
                _t(1, 2), model_changes={"n_kv_heads": Scale(2)}),
        Variant("ref_q48", "parameter reference: 1.5x the query heads (32 -> 48 at paper scale)", "q -> 1.5q",
                _t(1, 3), model_changes={"n_heads": Scale(1.5)}),
        Variant("ref_ffn_g1match", "parameter reference: the FFN widened by an elementwise G1 gate's parameters",
                "d_ff -> d_ff + q d_k / 3 (MoE: each expert + q d_k / 3E)", (),
                model_changes={"ffn": WidenByG1Gate()},
                reference="gatelab control (issue 34): Table 1's parameter references (rows (2)-(4)), by the FFN",
                note="The baseline with as many parameters as g1_elem_sig (within one FFN column a layer, or one "
                     "column of each expert): a reference that the paper's dense rows do not have (they match by "
                     "narrowing the gated model's FFN, model.match_params). In an MoE model the activated parameters "
                     "grow by top_k/E of the added ones."),
        Variant("ref_add4experts", "parameter reference: 4 more routed experts, one more activated",
                "E -> E+4, top-k -> top-k+1", _t(1, 4),
                model_changes={"moe.n_experts": Add(4), "moe.top_k": Add(1)},
                note="The paper's 400M is not reproducible from its description: 4 experts of 3*d*768 weights in 24 "
                     "layers are 453M. gatelab adds 4 routed experts (453M at paper scale) and raises top-k by one so "
                     "that 'the activated number of experts' grows too, as the paper says; MoE presets only."),
        Variant("g1_elem_sig", "G1 (after SDPA), elementwise, sigmoid", f"{_Y} = Y_{{t,i}} * sigmoid(X_t W^i)",
                _t(1, 5) + _t(3, 2) + _t(4, 2) + _t(2, 2, 4, 8, 10, 13, 14), (_gate("g1"),)),
        Variant("g2_elem_sig", "G2 (after V proj), elementwise, sigmoid", "V'_{j,g} = V_{j,g} * sigmoid(X_j W^g)",
                _t(1, 6) + _t(3, 3) + _t(4, 5), (_gate("g2"),)),
        Variant("g3_elem_sig", "G3 (after K proj), elementwise, sigmoid", "K'_{j,g} = K_{j,g} * sigmoid(X_j W^g)",
                _t(1, 7), (_gate("g3"),)),
        Variant("g4_elem_sig", "G4 (after Q proj), elementwise, sigmoid", "Q'_{t,i} = Q_{t,i} * sigmoid(X_t W^i)",
                _t(1, 8), (_gate("g4"),)),
        Variant("g5_elem_sig", "G5 (after W_O), elementwise, sigmoid", "O'_t = O_t * sigmoid(X_t W), W in R^{d x d}",
                _t(1, 9), (_gate("g5"),)),
        Variant("g1_head_sig", "G1, headwise (one scalar per head), sigmoid", f"{_Y} = Y_{{t,i}} * sigmoid(X_t w^i)",
                _t(1, 10) + _t(4, 3) + _t(2, 9), (_gate("g1", granularity="headwise"),)),
        Variant("g2_head_sig", "G2, headwise, sigmoid (= Switch v 1top1)", "V'_{j,g} = V_{j,g} * sigmoid(X_j w^g)",
                _t(1, 11), (_gate("g2", granularity="headwise"),)),
        Variant("g1_elem_sig_shared", "G1, elementwise, head-shared scores", "s_t = mean_i sigmoid(X_t W^i); "
                f"{_Y} = Y_{{t,i}} * s_t", _t(1, 12) + _t(4, 4), (_gate("g1", heads="shared"),)),
        Variant("g2_elem_sig_shared", "G2, elementwise, head-shared scores", "s_j = mean_g sigmoid(X_j W^g); "
                "V'_{j,g} = V_{j,g} * s_j", _t(1, 13), (_gate("g2", heads="shared"),)),
        Variant("g1_elem_silu_add", "G1, elementwise, additive SiLU", f"{_Y} = Y_{{t,i}} + SiLU(X_t W^i)",
                _t(1, 14) + _t(3, 4), (_gate("g1", form="additive", activation="silu"),)),
        Variant("g1_elem_silu", "G1, elementwise, multiplicative SiLU", f"{_Y} = Y_{{t,i}} * SiLU(X_t W^i)",
                _t(1, 15), (_gate("g1", activation="silu"),)),
        Variant("g1_rmsnorm", "RMSNorm of each head's SDPA output (d_k scale shared by heads)",
                f"{_Y} = RMSNorm_dk(Y_{{t,i}})", _t(3, 5), (_gate("g1", kind="rmsnorm"),),
                note="The paper does not give the scale's size; gatelab learns one d_k vector per layer."),
        Variant("g1_silu_noparam", "SiLU of the SDPA output, no parameters", f"{_Y} = SiLU(Y_{{t,i}})",
                _t(3, 6), (_gate("g1", kind="silu"),)),
        Variant("g1_elem_id_add", "G1, elementwise, additive identity", f"{_Y} = Y_{{t,i}} + X_t W^i",
                _t(3, 7), (_gate("g1", form="additive", activation="identity"),)),
        Variant("g1_inputindep_sig", "G1, elementwise, input-independent (zero-initialised q x d_k logits)",
                f"{_Y} = Y_{{t,i}} * sigmoid(b^i)", _t(4, 6), (_gate("g1", input_dependent=False),)),
        Variant("g1_elem_nssig", "G1, elementwise, NS-sigmoid (0.5 + 0.5 sigmoid)",
                f"{_Y} = Y_{{t,i}} * (0.5 + 0.5 sigmoid(X_t W^i))", _t(4, 7), (_gate("g1", activation="ns_sigmoid"),)),
        Variant("sandwich_norm", "no gate; an RMSNorm on each sublayer output before the residual add",
                "h = h + Norm(Attn(Norm(h)))", _t(2, 7), model_changes={"sandwich_norm": True}),
        # Controls, not in the paper: what a gate does to the size of the attention output at init, without gating.
        Variant("ctrl_scale_0p5", "control: the SDPA output times 0.5 (a sigmoid gate's score at init), no parameters",
                f"{_Y} = 0.5 Y_{{t,i}}", (), (_gate("g1", kind="scale", scale=0.5),),
                note="Tests whether G1's gain needs input-dependent gating or only a smaller attention output."),
        Variant("ctrl_scale_silu", "control: the SDPA output times the RMS of a SiLU gate's scores at init",
                f"{_Y} = c Y_{{t,i}}, c = RMS(SiLU(z)), z ~ N(0, d_model init_std^2)", (),
                (_gate("g1", kind="scale", scale="silu_gate_init"),),
                note="c depends on the model: 0.115 for d_model 128 at init_std 0.02 (gatelab.model.gates)."),
        Variant("ctrl_oproj_init_0p5", "control: no gate; the output projection initialised at half the std",
                "O = concat(Y) W_O, W_O ~ N(0, (0.5 init_std)^2)", (), model_changes={"o_proj_init_scale": 0.5},
                note="The attention output starts as small as under a sigmoid gate; the forward pass is the "
                     "baseline's."),
    ]
    + [
        Variant(f"switch_{proj}_{e}top{k}", f"Switch-Head: {e} experts per KV head for {proj.upper()}, top-{k}",
                f"{proj.upper()}'_{{j,g}} = sum_(e in top{k}) sigmoid(X_j r^g_e) X_j W^(g,e)", _t(6, row),
                model_changes={"switch_head": SwitchHeadConfig(projections=proj, n_experts=e, top_k=k)},
                note="Experts replace the KV head's projection (E copies) with a sigmoid router per KV head; the "
                     "paper's Table 6 parameter counts are not reproducible from its description.",
                reference="Csordas et al. 2024, SwitchHead; Qiu et al. 2025, Table 6")
        for proj, e, k, row in [("kv", 8, 8, 2), ("kv", 4, 4, 3), ("v", 4, 4, 4), ("v", 8, 2, 5), ("v", 1, 1, 6)]
    ]
    + [
        # Not in the paper (issue 33): every way a head can learn to do nothing. A sink softmax or a KV-bias slot gives
        # a head somewhere to put its attention that is not a token; sigmoid attention and softpick drop the
        # sum-to-one; the last gates differ from g1_elem_sig in activation, init, or the precision of the scores.
        Variant("sink_off_by_one", "softmax with an extra zero logit: a sink that is not a token, no parameters",
                "p_tj = exp(s_tj) / (1 + sum_{j'<=t} exp(s_tj'))", model_changes={"attention": "off_by_one"},
                reference="Miller 2023, 'Attention is off by one'; Megatron-LM softmax_type: off-by-one",
                note=_VIRTUAL_SLOT.format(slot="sink (zero key, zero value)")),
        Variant("sink_learnable", "softmax with a learned sink logit per query head, 0 at init",
                "p_tj = exp(s_tj) / (exp(b_h) + sum_{j'<=t} exp(s_tj'))", model_changes={"attention": "learnable_sink"},
                reference="OpenAI 2025, gpt-oss (attention sinks); Megatron-LM softmax_type: learnable",
                note=_VIRTUAL_SLOT.format(slot="sink") + " q, k and v also gain 8 feature columns (flash takes head "
                     "dims in multiples of 8) that give the sink the score b_h: (d_k + 8) / d_k the attention FLOPs, "
                     "+6% at d_k 128. n_heads parameters a layer, not weight-decayed."),
        Variant("sigmoid_attn", "sigmoid attention without normalisation, bias -log n",
                "Y_t = sum_{j<=t} sigmoid(s_tj - log(t+1)) V_j", model_changes={"attention": "sigmoid"},
                reference="Gu et al. 2025 (ICLR), 'When Attention Sink Emerges in Language Models', section 7.4; "
                          "b = -log n: Ramapuram et al. 2025 (ICLR), 'Theory, Analysis, and Best Practices for "
                          "Sigmoid Self-Attention' (arXiv 2409.04431)",
                note="n is the number of tokens query t attends to (t + 1), Ramapuram et al.'s sequence length taken "
                     "per query, so an output depends on nothing after its token, not even the window length. "
                     + _EXPLICIT + " FlashSigmoid (Ramapuram et al., apple/ml-sigmoid-attention) is a separate CUDA "
                     "library, not used here."),
        Variant("kv_bias", "a learned key and value per KV head (0 at init) that every query attends to",
                "Y_t = (e^{s_t0} v_0 + sum_{j<=t} e^{s_tj} V_j) / (e^{s_t0} + sum_{j<=t} e^{s_tj}), "
                "s_t0 = q_t k_0 / sqrt(d_k)", model_changes={"kv_bias": True},
                reference="Gu et al. 2025 (ICLR), 'When Attention Sink Emerges in Language Models', section 7.3 "
                          "(K and V biases)",
                note=_VIRTUAL_SLOT.format(slot="KV-bias slot (k_0, v_0)") + " k_0 has neither RoPE nor QK-norm (it "
                     "is not a token) and no gate touches k_0 or v_0. 2 k d_k parameters a layer, stored flat and "
                     "not weight-decayed; composes with every attention kind (sigmoid, softpick: explicit path)."),
        Variant("softpick", "softpick: rectified softmax, rows may sum to less than 1 (or to 0)",
                "p_tj = relu(exp(s_tj) - 1) / sum_{j'<=t} |exp(s_tj') - 1|", model_changes={"attention": "softpick"},
                reference="Zuhri, Fuadi and Aji 2025, 'Softpick: No Attention Sink, No Massive Activations with "
                          "Rectified Softmax' (arXiv 2504.20966)",
                note="Computed in their stable form, the row max m factored out: relu(e^(s-m) - e^-m) / "
                     "(sum |e^(s-m) - e^-m| + 1e-8). " + _EXPLICIT),
        Variant("g1_elem_softplus_fp32", "G1, elementwise, softplus, computed in float32",
                f"{_Y} = Y_{{t,i}} * softplus(X_t W^i)", (),
                (_gate("g1", activation="softplus", compute_dtype="float32"),),
                reference="Poolside 2025, Laguna (softplus attention-output gate in float32)",
                note="Scores start near log 2 = 0.69 (softplus of small logits), not 0.5."),
        Variant("g1_elem_2sig_zeroinit",
                "G1, elementwise, 2 sigmoid with zero-initialised gate rows: starts as no gate",
                f"{_Y} = Y_{{t,i}} * 2 sigmoid(X_t W^i), W^i = 0 at init", (),
                (_gate("g1", activation="two_sigmoid", init="zero"),),
                reference="marin; parameter-golf (2 sigmoid gate, zero init)",
                note="Every score is exactly 1 at init, so the model's output equals baseline's for the same seed: the "
                     "gate rows are zeroed by init_weights, every other parameter keeps its random stream."),
        Variant("g1_elem_sig_fp32", "G1, elementwise, sigmoid computed in float32 (g1_elem_sig uses the model dtype)",
                f"{_Y} = Y_{{t,i}} * sigmoid(fp32(X_t W^i))", (), (_gate("g1", compute_dtype="float32"),),
                reference="Megatron-LM attention output gate (float32 sigmoid); g1_elem_sig follows the paper's code "
                          "and Qwen3-Next (model dtype)",
                note="Under 32-true identical to g1_elem_sig; differs under bf16-mixed, where the score and the "
                     "product are rounded to bf16 in g1_elem_sig."),
    ]
}


def get_variant(variant_id: str) -> Variant:
    if variant_id in VARIANTS:
        return VARIANTS[variant_id]
    close = difflib.get_close_matches(variant_id, VARIANTS, n=3)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise GatelabError(f"unknown variant '{variant_id}': {hint}valid variants are {', '.join(VARIANTS)}")


def variant_ids(spec: str) -> list[str]:
    """'g1_elem_sig+g2_elem_sig' -> both ids, each checked; 'baseline' composes with anything as a no-op."""
    ids = [part.strip() for part in spec.split("+") if part.strip()]
    if not ids:
        raise GatelabError(f"empty variant '{spec}': valid variants are {', '.join(VARIANTS)}")
    for variant_id in ids:
        get_variant(variant_id)
    return ids


def apply_variant(base: ModelConfig, spec: str) -> ModelConfig:
    """The base model with the variant's gates appended and its model changes applied."""
    tree = base.model_dump()
    changed: dict[str, str] = {}
    for variant_id in variant_ids(spec):
        variant = VARIANTS[variant_id]
        tree["gates"] = tree["gates"] + [g.model_dump() for g in variant.gates]
        for dotted, change in variant.model_changes.items():
            if dotted in changed:
                raise GatelabError(f"variant '{spec}': {changed[dotted]} and {variant_id} both change model.{dotted}")
            changed[dotted] = variant_id
            *parents, leaf = dotted.split(".")
            node = tree
            for part in parents:
                if node.get(part) is None:
                    raise GatelabError(f"variant '{variant_id}' changes model.{dotted}, but this experiment's model "
                                       f"has no '{part}' block (it needs an MoE preset such as "
                                       "experiments/tiny-moe.yaml)")
                node = node[part]
            change.apply_to(tree, node, leaf)
    try:
        return ModelConfig.model_validate(tree)
    except ValidationError as exc:
        raise GatelabError(format_validation_error(exc, f"variant '{spec}'", ModelConfig)) from None
