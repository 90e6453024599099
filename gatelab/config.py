"""The typed config tree of one experiment, validated before anything runs.

Every component choice is a `Literal` string so a config stays YAML-serialisable and a typo is answered with the valid
values. Unknown keys are errors with a "did you mean". Errors name the file and the dotted key path.

Validation checks values and types and reads no file: the YAML and `--set` are read by `gatelab.config_files`, what
only the data's files can tell (a `data.tokenizer` that loads, `model.vocab_size: auto`) is settled by
`gatelab.data.resolve`, and a run's identity (`spec_hash`), which hashes those files, is `gatelab.data.identity`'s.
"""

from __future__ import annotations

import difflib
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from gatelab.errors import GatelabError

GatePosition = Literal["g1", "g2", "g3", "g4", "g5"]


@dataclass(frozen=True)
class AttentionKindTraits:
    """What one `model.attention` kind is, for the config (its name and doc), the model (its flags) and the docs."""

    fused: bool  # the training path is one SDPA call that the flash kernel takes; else the explicit path in blocks
    sink: bool  # a softmax with a sink logit: mass the real tokens do not get
    doc: str  # how a query's scaled causal scores s_j become the weights of the values


# Declared once: the config's valid values (in its error's order), the flags of gatelab.model.attention_kinds, the docs.
ATTENTION_KINDS: dict[str, AttentionKindTraits] = {
    "softmax": AttentionKindTraits(fused=True, sink=False, doc="exp(s_j) / sum_j exp(s_j)"),
    "off_by_one": AttentionKindTraits(
        fused=True, sink=True,
        doc="exp(s_j) / (1 + sum_j exp(s_j)): a sink logit fixed at 0 takes mass from every token (Miller 2023; "
            "Megatron-LM softmax_type off-by-one)"),
    "learnable_sink": AttentionKindTraits(
        fused=True, sink=True,
        doc="exp(s_j) / (exp(b_h) + sum_j exp(s_j)), one learned b_h per query head from 0 (gpt-oss; Megatron-LM "
            "softmax_type learnable)"),
    "sigmoid": AttentionKindTraits(
        fused=False, sink=False,
        doc="sigmoid(s_j - log n), n the keys the query attends to, no normalisation (Gu et al. 2025, section 7.4; "
            "b = -log n after Ramapuram et al. 2024): explicit (B, H, T, T) path"),
    "softpick": AttentionKindTraits(
        fused=False, sink=False,
        doc="relu(exp(s_j) - 1) / sum_j |exp(s_j) - 1| (Zuhri et al. 2025): explicit (B, H, T, T) path"),
}
# pydantic checks a Literal; `ModelConfig._known_attention` words the error before it, with the same names in order
AttentionKind = Literal[tuple(ATTENTION_KINDS)]


class StrictModel(BaseModel):
    # allow_inf_nan=False: `.inf` and `.nan` are YAML floats, and no gatelab setting means anything at either.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class GateConfig(StrictModel):
    """One gate (or one parameter-free non-linearity) in every attention layer.

    `kind: gate` is the paper's Eq. 5, Y' = Y * act(X W_theta) (or Y + act(X W_theta) when additive), with X the
    pre-norm hidden state of the token Y belongs to: the query token for G1/G4/G5, the key/value token for G2/G3.
    `kind: rmsnorm` and `kind: silu` are Table 3's parameter-free ablations on the SDPA output (G1 only).
    `kind: scale` is a control, not a gate: Y' = c Y with a constant c (`scale`), or with c the root mean square of a
    multiplicative SiLU gate's scores at initialisation (`scale: silu_gate_init`, see gatelab.model.gates).
    """

    position: GatePosition = Field(
        description="what the gate scales: g1 the SDPA output, g2 values, g3 keys, g4 queries, g5 the o_proj output")
    kind: Literal["gate", "rmsnorm", "silu", "scale"] = Field(
        "gate", description="a learned gate (Eq. 5), or a parameter-free rmsnorm, silu or constant scale of Y (g1)")
    scale: PositiveFloat | Literal["silu_gate_init"] | None = Field(
        None, description="kind 'scale' only: c in Y' = c Y, or silu_gate_init (a SiLU gate's RMS at init)")
    granularity: Literal["elementwise", "headwise"] = Field(
        "elementwise", description="one score per element of each head's vector, or one score per head")
    heads: Literal["specific", "shared"] = Field(
        "specific", description="each head its own gate projection, or one set of scores shared by all heads")
    # The paper's 201M/25M counts for the shared rows imply the full per-head projection is kept and the scores are
    # averaged over heads (README, 'Decisions the paper leaves open'); `single_projection` is the cheaper reading of
    # "W_theta ... shared".
    shared_scores: Literal["mean_of_scores", "single_projection"] = Field(
        "mean_of_scores", description="heads 'shared': average the per-head scores, or compute one score projection")
    form: Literal["multiplicative", "additive"] = Field(
        "multiplicative", description="Y' = Y * act(X W_theta), or Y' = Y + act(X W_theta)")
    # two_sigmoid is 2 sigmoid(z): 1 at z = 0, so with `init: zero` the gate starts as no gate (marin, parameter-golf);
    # softplus is Poolside Laguna's gate (computed in float32 there).
    activation: Literal["sigmoid", "silu", "ns_sigmoid", "identity", "softplus", "two_sigmoid"] = Field(
        "sigmoid", description="act on the logits; ns_sigmoid: 0.5 + 0.5 sigmoid (Eq. 9), two_sigmoid: 2 sigmoid")
    input_dependent: bool = Field(
        True, description="scores from the hidden state X (X W_theta), or from learned logits that ignore the input")
    before_qk_norm: bool = Field(
        True, description="g3/g4 only: gate the raw projection before QK-norm and RoPE (Eq. 1), or after QK-norm")
    # The model's dtype is bf16 under bf16-mixed (the paper's code, Qwen3-Next); float32 is Megatron-LM's and Laguna's.
    compute_dtype: Literal["model", "float32"] = Field(
        "model", description="dtype of the activation and product: the model's, or float32 cast back after the product")
    # The other rows of the fused in_proj keep their values (common random numbers).
    init: Literal["normal", "zero"] = Field(
        "normal", description="this gate's logit rows at init: N(0, init_std) as every weight, or zero (scores act(0))")

    @model_validator(mode="after")
    def _check(self) -> GateConfig:
        if self.kind != "gate" and self.position != "g1":
            raise ValueError(f"kind '{self.kind}' acts on the SDPA output and needs position 'g1', not "
                             f"'{self.position}'")
        if self.kind != "gate" and (self.compute_dtype != "model" or self.init != "normal"):
            raise ValueError(f"compute_dtype and init set a learned gate's scores and logit rows; kind '{self.kind}' "
                             "has neither: leave them out, or use kind 'gate'")
        if self.init == "zero" and not self.input_dependent:
            raise ValueError("init 'zero' sets the logit rows of an input-dependent gate; an input-independent gate's "
                             "logits always start at zero: leave init out, or set input_dependent: true")
        if (self.kind == "scale") != (self.scale is not None):
            raise ValueError("scale: set it (a positive number or 'silu_gate_init') with kind 'scale', and only then"
                             if self.kind == "scale" else f"scale is for kind 'scale', not kind '{self.kind}'")
        return self


def _check_top_k(routed):
    if routed.top_k > routed.n_experts:
        raise ValueError(f"top_k ({routed.top_k}) is larger than n_experts ({routed.n_experts}): "
                         f"valid top_k is 1..{routed.n_experts}")
    return routed


class MoEConfig(StrictModel):
    """Fine-grained top-k routed experts (softmax router, renormalised top-k weights, as Qwen-MoE)."""

    n_experts: PositiveInt = Field(description="routed experts per MoE layer")
    top_k: PositiveInt = Field(description="experts each token is routed to")
    expert_hidden: PositiveInt = Field(description="each expert's SwiGLU hidden width")
    normalize_top_k: bool = Field(True, description="renormalise the top-k router weights to sum to 1 (Qwen-MoE)")
    load_balance_coef: float = Field(0.01, ge=0, description="weight of the load-balancing loss added to the LM loss")
    z_loss_coef: float = Field(0.001, ge=0, description="weight of the router z-loss (squared logsumexp of its logits)")

    @model_validator(mode="after")
    def _check(self):
        return _check_top_k(self)


class SwitchHeadConfig(StrictModel):
    """Per-KV-head mixture-of-experts value (and key) projections, after Csordas et al.'s SwitchHead (Table 6)."""

    projections: Literal["v", "kv"] = Field(description="which projections have experts: values, or keys and values")
    n_experts: PositiveInt = Field(description="experts per KV head")
    top_k: PositiveInt = Field(description="experts each token uses per KV head")

    @model_validator(mode="after")
    def _check(self):
        return _check_top_k(self)


class ModelConfig(StrictModel):
    """A pre-norm decoder-only transformer: RMSNorm, RoPE, SwiGLU, GQA, QK-norm; dense or MoE FFN."""

    # `auto` is settled when the experiment is resolved (gatelab.data.resolve), so a run's params and spec hash record
    # the integer.
    vocab_size: PositiveInt | Literal["auto"] = Field(
        description="tokens in the vocabulary, or auto: data.tokenizer's size rounded up to a multiple of 128")
    n_layers: PositiveInt = Field(description="transformer blocks")
    d_model: PositiveInt = Field(description="width of the residual stream")
    n_heads: PositiveInt = Field(description="query heads, q")
    n_kv_heads: PositiveInt = Field(description="key/value heads, k (GQA); divides n_heads")
    head_dim: PositiveInt = Field(description="width of each head, d_k (even, for RoPE)")
    ffn: Literal["dense", "moe"] = Field("dense", description="the feed-forward block: a SwiGLU, or routed experts")
    ffn_hidden: PositiveInt | None = Field(None, description="dense SwiGLU hidden width (experts: moe.expert_hidden)")
    moe: MoEConfig | None = Field(None, description="the routed experts, with ffn: moe")
    tie_embeddings: bool = Field(True, description="the output head shares the input embedding's weights")
    qk_norm: bool = Field(True, description="RMSNorm on each head's queries and keys before RoPE")
    sandwich_norm: bool = Field(False, description="RMSNorm each sublayer's output before its residual add (Table 2)")
    norm_eps: PositiveFloat = Field(1e-6, description="epsilon of every RMSNorm")
    rope_base: PositiveFloat = Field(10_000.0, description="RoPE base frequency, theta")
    init_std: PositiveFloat = Field(  # 0.02 for every weight, gates included, as the official code
        0.02, description="standard deviation of the normal init of every weight")
    # The init-matched control: an attention output as small at the start as a gate's, the forward pass unchanged.
    o_proj_init_scale: PositiveFloat = Field(1.0, description="the output projection's init std, times init_std")
    gates: list[GateConfig] = Field([], description="the gates in every attention layer, usually set by the variant")
    switch_head: SwitchHeadConfig | None = Field(None, description="expert value (and key) projections (Table 6)")
    # Dense rows of the paper keep the parameter count by narrowing the FFN; MoE rows are not matched.
    match_params: bool = Field(False, description="narrow ffn_hidden so a gated model has the baseline's parameters")
    attention: AttentionKind = Field(
        "softmax", description="how a query's scores become attention weights (formulas: config.ATTENTION_KINDS)")
    # A sink slot that is not a token (Gu et al. 2025, section 7.3, "K and V biases"). Composes with any kind.
    kv_bias: bool = Field(
        False, description="a learned key and value per KV head (zero at init, no position) every query attends to")

    @field_validator("attention", mode="before")
    @classmethod
    def _known_attention(cls, value: Any) -> Any:
        valid = list(ATTENTION_KINDS)
        if isinstance(value, str) and value not in valid:
            close = difflib.get_close_matches(value.replace("-", "_"), valid, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ValueError(f"'{value}' is not one of {', '.join(valid)}{hint}")
        return value

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.n_heads % self.n_kv_heads:
            valid = [k for k in range(1, self.n_heads + 1) if self.n_heads % k == 0]
            raise ValueError(f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads}): "
                             f"valid n_kv_heads are {', '.join(map(str, valid))}")
        if self.ffn == "moe" and self.moe is None:
            raise ValueError("ffn is 'moe' but the moe block is missing (n_experts, top_k, expert_hidden)")
        if self.ffn == "dense" and self.ffn_hidden is None:
            raise ValueError("ffn is 'dense' but ffn_hidden is missing")
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for RoPE")
        return self


class BigramBackcopyConfig(StrictModel):
    """Bigram-Backcopy (Guo et al. 2024, arXiv 2410.13835): a bigram chain over the ordinary tokens, except that after
    a trigger token the token before the trigger is copied. Attention sinks form on it within minutes of training.

    Ids: 0 is BOS (every sequence starts with it), 1 is EOS (reserved, never emitted), 2..vocab_size-1 the ordinary
    tokens; the triggers are the `n_triggers` most probable ordinary tokens under the chain's stationary distribution.
    """

    n_triggers: PositiveInt = Field(3, description="trigger tokens, after which the token before is copied (Guo's k)")
    # Below 1 the rows are peaked, so the bigram part is learnable and its entropy well below log(vocab).
    concentration: PositiveFloat = Field(
        0.1, description="mean parameter of the Dirichlet each row of the transition matrix is drawn from")
    # Skewed as in text, so the triggers, the most frequent tokens, are frequent: Guo et al.'s chain is estimated from
    # text, where the k = 3 most frequent tokens fill a large share of positions.
    zipf_exponent: float = Field(
        0.0, ge=0, description="the Dirichlet's mean row is proportional to 1 / rank ** zipf_exponent (0: uniform)")
    train_sequences: PositiveInt = Field(20_000, description="training sequences generated, of data.seq_len tokens")
    heldout_sequences: PositiveInt = Field(512, description="held-out sequences generated for evaluation")
    data_seed: int = Field(0, description="seed of the chain and the sequences; the run's seed only orders the windows")


_DOMAIN_NAME = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$"  # a folder name: no "..", no "/"


class CorpusFields(StrictModel):
    """Which columns of a `files` or `hf` source make a document, and how its documents fall into domains.

    Without `id_field` the held-out split is still fixed by content alone (README, 'Your own corpus');
    `max_documents` is a deterministic sample of a big corpus that a small run cannot use up anyway.
    """

    text_field: str = Field("text", description="the column holding each document's text")
    id_field: str | None = Field(None, description="the column of document ids; unset, a hash of the text")
    domain_field: str | None = Field(
        None, description="a column whose values name each document's evaluation domain; unset, one domain: domain")
    domain: str = Field("corpus", pattern=_DOMAIN_NAME, description="the one domain's name without domain_field")
    max_documents: PositiveInt | None = Field(
        None, description="keep the first N documents (files in sorted order, rows in file order)")

    @model_validator(mode="after")
    def _check_domain(self) -> CorpusFields:
        # Only a domain other than the default: a dumped config (a checkpoint's record, the params) names the default
        # beside domain_field, and must read back as itself.
        default = type(self).model_fields["domain"].default
        if self.domain_field is not None and "domain" in self.model_fields_set and self.domain != default:
            raise ValueError("set domain_field (a column that names each document's domain) or domain (one name for "
                             "the whole source), not both")
        return self


class FilesSourceConfig(CorpusFields):
    """`data.source: files`: globs of .parquet, .jsonl, .jsonl.gz, .json or .txt files (a .txt file is one document)."""

    paths: list[str] = Field([], description="globs of the corpus files, e.g. ['~/corpus/*.parquet']")


class HFSourceConfig(CorpusFields):
    """`data.source: hf`: a dataset on the Hugging Face Hub (or a local folder of its shards), streamed."""

    dataset: str = Field(description="a Hub dataset or a local folder of its shards, e.g. HuggingFaceFW/fineweb-edu")
    config: str | None = Field(None, description="the dataset's configuration, e.g. sample-10BT")
    split: str = Field("train", description="the dataset's split streamed, e.g. train")
    revision: str | None = Field(
        None, description="a commit, tag or branch: pin it, or the run's identity follows the Hub's main")


class DataConfig(StrictModel):
    """Which text a run trains and evaluates on, or the synthetic task that replaces it (`task`).

    With `task: bigram_backcopy` the text keys (domains, data_dir, user_files) are unused: the sequences are generated
    in memory from `bigram_backcopy` and the vocabulary is `model.vocab_size`.

    Documents are framed `bos_token text eos_token`; unset, those are found among the common names, and a tokenizer
    with only an end-of-text token (GPT-2, Qwen) uses it for both (README, 'Decisions the paper leaves open').
    """

    task: Literal["text", "bigram_backcopy"] = Field(
        "text", description="train on text, or on the synthetic Bigram-Backcopy task (bigram_backcopy)")
    tokenizer: str = Field("bpe", description="bpe (a byte-level BPE trained here to model.vocab_size), a "
                                              "tokenizer.json path, or a Hub tokenizer name such as Qwen/Qwen3-0.6B")
    bos_token: str | None = Field(None, description="the token opening each document (a tokenizer file or name only)")
    eos_token: str | None = Field(None, description="the token closing each document (a tokenizer file or name only)")
    domains: list[str] = Field(["speeches", "fiction", "nonfiction", "scripture", "code"],
                               description="the domains trained and evaluated on (files or hf: unset or [] is all)")
    data_dir: str | None = Field(
        None, description="where corpora and tokens are kept; default $GATELAB_DATA_DIR, else ~/.cache/gatelab/data")
    user_files: dict[str, list[str]] = Field(
        {}, description="extra domains from your own text files beside the built-in ones: {domain: [paths]}")
    seq_len: PositiveInt = Field(256, description="tokens per training sequence (the context length)")
    bigram_backcopy: BigramBackcopyConfig = Field(
        BigramBackcopyConfig(), description="the synthetic task's settings, with task: bigram_backcopy")
    # files and hf are read with the `datasets` library into a folder of their own under data_dir
    # (gatelab.data.external).
    source: Literal["builtin", "files", "hf"] = Field(
        "builtin", description="where the text comes from: the built-in corpora, your files (files) or the Hub (hf)")
    files: FilesSourceConfig | None = Field(None, description="the files read, with source: files")
    hf: HFSourceConfig | None = Field(None, description="the Hub dataset read, with source: hf")
    # How the tokens are stored and read, not which: neither changes a run's batches, so neither is in its spec hash.
    # shard_mb applies when a split is made (a finished split is read as it is: its tokens are the same).
    shard_mb: PositiveFloat = Field(64.0, description="MiB of text per token shard, what a killed prepare resumes from")
    loader_workers: NonNegativeInt = Field(0, description="DataLoader processes making batches (a GPU run wants some)")

    @model_validator(mode="after")
    def _check_source(self) -> DataConfig:
        if self.source != "files" and self.files is not None:
            raise ValueError(f"data.files is set but data.source is '{self.source}': set data.source: files, or "
                             "remove data.files")
        if self.source != "hf" and self.hf is not None:
            raise ValueError(f"data.hf is set but data.source is '{self.source}': set data.source: hf, or remove "
                             "data.hf")
        if self.source == "files" and (self.files is None or not self.files.paths):
            raise ValueError("data.source is 'files' but data.files.paths is empty: list globs of .parquet, .jsonl, "
                             ".jsonl.gz, .json or .txt files, e.g. paths: ['~/corpus/*.parquet']")
        if self.source == "hf" and self.hf is None:
            raise ValueError("data.source is 'hf' but data.hf is missing: give at least data.hf.dataset, e.g. "
                             "HuggingFaceFW/fineweb-edu")
        if self.source != "builtin":
            if self.user_files:
                raise ValueError(f"data.user_files adds domains to the built-in corpora; with data.source "
                                 f"'{self.source}' put those files in the source instead (data.files.paths)")
            if "domains" not in self.model_fields_set:
                self.domains = []  # every domain the source has; the built-in names would not be there
        return self


class TrainConfig(StrictModel):
    """Optimisation and Lightning Trainer settings."""

    max_steps: PositiveInt = Field(1000, description="optimizer steps of the run")
    batch_size: PositiveInt = Field(16, description="the global batch: sequences per optimizer step over all devices")
    lr: PositiveFloat = Field(2e-3, description="peak learning rate of AdamW, after warmup")
    min_lr: float = Field(3e-5, ge=0, description="the learning rate the cosine decay reaches at max_steps")
    warmup_steps: int = Field(100, ge=0, description="steps of linear warmup from 0 to lr")
    weight_decay: float = Field(0.1, ge=0, description="AdamW's weight decay on weight matrices (not on norms)")
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = Field(
        (0.9, 0.95), description="AdamW's beta1 and beta2")
    grad_clip: float = Field(1.0, ge=0, description="clip the gradient's global norm to this (0: no clipping)")
    precision: Literal["32-true", "bf16-mixed", "16-mixed", "auto"] = Field(
        "auto", description="Lightning's precision; auto: bf16-mixed where bf16 is fast, else 16-mixed (GPU), 32-true")
    accelerator: Literal["auto", "cpu", "gpu", "cuda", "mps"] = Field("auto", description="Lightning's accelerator")
    devices: int | Literal["auto"] = Field(1, description="devices per node (Lightning's devices)")
    num_nodes: PositiveInt = Field(1, description="machines the run spans (Lightning's num_nodes)")
    strategy: Literal["auto", "ddp", "fsdp", "ddp_spawn"] = Field("auto", description="Lightning's strategy")
    checkpoint_every: PositiveInt = Field(100, description="steps between checkpoints, which a re-run resumes from")
    log_every: PositiveInt = Field(10, description="steps between logged training losses")
    spike_margin: PositiveFloat = Field(0.15, description="a spike: loss above its EMA by this many nats after warmup")
    spike_ema: float = Field(0.98, gt=0, lt=1, description="decay of the loss's exponential moving average")
    divergence_factor: PositiveFloat = Field(
        3.0, description="loss above this multiple of its EMA (or non-finite): the run diverged and stops")
    threads: PositiveInt | None = Field(None, description="torch CPU threads; unset, torch's choice")
    # A speed setting, not in a run's identity (spec_hash): losses equal to float rounding. tiny.yaml turns it on,
    # where `gatelab bench` measured it to pay. Its cache is shared by a runs folder's runs (gatelab.train.compiling).
    compile: bool = Field(False, description="torch.compile each block and the head loss for training (not evaluation)")
    # "reduce-overhead" adds CUDA graphs (pays where the GPU waits on kernel launches); "max-autotune-no-cudagraphs"
    # benchmarks GEMM and Triton configurations while compiling (minutes). Not in spec_hash either.
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = Field(
        "default", description="torch.compile's mode, with compile: true")
    # Weight decay on input-independent gate logits pulls them to 0, a score of 0.5, unlike the paper's "no weight
    # decay on gates". The first-pass sweeps of results/tiny set it true.
    decay_gate_logits: bool = Field(
        False, description="weight decay on input-independent gate logits; off, they join the norms' group")

    @model_validator(mode="after")
    def _check_schedule(self) -> TrainConfig:
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr:g}) is above lr ({self.lr:g}): the schedule decays from lr to "
                             "min_lr; set min_lr at most lr (e.g. lr / 100)")
        return self


class LmEvalConfig(StrictModel):
    """lm-evaluation-harness at the end of a run (gatelab.eval.scoring); scores are `lm_eval/<task>/<metric>`."""

    tasks: list[str] = Field(
        min_length=1, description="lm-eval task names, e.g. [gatelab_blimp] offline, [hellaswag] with the Hub")
    num_fewshot: NonNegativeInt | None = Field(None, description="few-shot examples; unset, each task's own")
    limit: PositiveFloat | None = Field(None, description="documents per task, or below 1 a fraction of them")
    include_path: str | None = Field(None, description="a folder of your own task YAMLs, beside gatelab's offline ones")


class EvalBudget(StrictModel):
    """How much held-out text of each domain the end-of-run scores read (perplexity, bits per byte, W8A8, the probes'
    batches): exactly one of `documents`, `bytes` or `tokens`. The text is packed into windows of data.seq_len + 1
    tokens, a tail shorter than one dropped. Documents and bytes are the same text under any tokenizer; tokens only
    under one tokenizer."""

    documents: PositiveInt | None = Field(None, description="the first N held-out documents of each domain, whole")
    bytes: PositiveInt | None = Field(
        None, description="held-out text up to N UTF-8 bytes, cut at a token's end (a byte-level tokenizer)")
    tokens: PositiveInt | None = Field(None, description="the first N held-out tokens of each domain")

    @model_validator(mode="after")
    def _one_unit(self) -> EvalBudget:
        given = [unit for unit in BUDGET_UNITS if getattr(self, unit) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(BUDGET_UNITS)} (got {', '.join(given) or 'none'}), e.g. "
                             "eval.budget: {bytes: 1000000}: bytes and documents are the same held-out text under "
                             "any tokenizer, so cells with different tokenizers compare; tokens only where every "
                             "cell shares the tokenizer")
        return self

    @property
    def unit(self) -> str:
        return next(unit for unit in BUDGET_UNITS if getattr(self, unit) is not None)

    @property
    def name(self) -> str:
        """The budget in its canonical form, e.g. `bytes=1000000`."""
        return f"{self.unit}={getattr(self, self.unit)}"


BUDGET_UNITS = ("documents", "bytes", "tokens")


class EvalConfig(StrictModel):
    """End-of-run (and optionally periodic) evaluation.

    `budget` is not in a run's spec hash: a run records it as the param `resolved.eval.budget` (`budget_name`), and
    reports never compare runs whose budgets differ (gatelab.report.budgets)."""

    every_n_steps: PositiveInt | None = Field(None, description="steps between validations while training; unset, none")
    batch_size: PositiveInt = Field(16, description="sequences per evaluation forward pass")
    max_windows_per_domain: PositiveInt = Field(
        64, description="without a budget: windows read per domain, spread over its held-out split; also validation's")
    budget: EvalBudget | None = Field(
        None, description="the held-out text the end-of-run scores read, the same for every cell of a sweep")
    long_context_multipliers: list[PositiveInt] = Field(
        [1, 2, 4, 8], description="long_ppl/x<m> is scored at m times data.seq_len tokens, for each m")
    blimp: bool = Field(True, description="score BLiMP's minimal pairs at the end of every text run")
    blimp_path: str | None = Field(None, description="a folder of the official BLiMP's <paradigm>.jsonl files; unset, "
                                                     "the subset shipped with gatelab (100 pairs a paradigm)")
    blimp_per_paradigm: PositiveInt = Field(20, description="BLiMP pairs scored per paradigm")
    in_context_examples: PositiveInt = Field(64, description="examples per in-context task (induction, MQAR, needle)")
    probe_batches: PositiveInt = Field(2, description="batches the probes (sinks, activations, gate scores) read")
    lm_eval: LmEvalConfig | None = Field(None, description="lm-evaluation-harness tasks scored at the end of the run")

    def budget_name(self, seq_len: int) -> str:
        """The budget the end-of-run scores read, in canonical form: `windows=64x256` (max_windows_per_domain windows
        of seq_len) without one, else the budget's, e.g. `bytes=1000000`."""
        return self.budget.name if self.budget is not None else f"windows={self.max_windows_per_domain}x{seq_len}"


class TrackingConfig(StrictModel):
    """Where MLflow records runs; default: a SQLite store and artifacts under runs/."""

    uri: str | None = Field(None, description="the MLflow tracking URI; unset, sqlite under the runs folder")
    experiment: str | None = Field(None, description="the MLflow experiment's name; unset, the experiment's name")


class ExperimentConfig(StrictModel):
    """One run: a base model, a variant from the registry, data, training, evaluation and tracking."""

    name: str = Field(description="the run's name: its MLflow experiment, unless tracking.experiment")
    variant: str = Field(
        "baseline", description="a registry id (gatelab variants); '+' composes several, e.g. g1_elem_sig+g2_elem_sig")
    seed: int = Field(0, description="the run's seed: initial weights, batch order, evaluation samples")
    model: ModelConfig = Field(description="the base model, before the variant is applied")
    data: DataConfig = Field(DataConfig(), description="the text (or synthetic task) trained and evaluated on")
    train: TrainConfig = Field(TrainConfig(), description="optimisation and Lightning Trainer settings")
    eval: EvalConfig = Field(EvalConfig(), description="end-of-run (and periodic) evaluation")
    tracking: TrackingConfig = Field(TrackingConfig(), description="where MLflow records the run")

    @model_validator(mode="after")
    def _check(self) -> ExperimentConfig:
        if self.data.task == "bigram_backcopy" and self.model.vocab_size == "auto":
            raise ValueError("model.vocab_size 'auto' takes the size of data.tokenizer, which data.task "
                             "'bigram_backcopy' does not use: give an integer")
        if self.data.task == "text" and self.data.tokenizer == "bpe":
            self._check_trained_bpe()
        if self.data.task == "bigram_backcopy":
            n_triggers = self.data.bigram_backcopy.n_triggers
            if self.model.vocab_size - 2 <= n_triggers + 2:
                raise ValueError(f"model.vocab_size ({self.model.vocab_size}) is too small for data.task "
                                 f"'bigram_backcopy' with data.bigram_backcopy.n_triggers {n_triggers}: ids 0 and 1 "
                                 "are BOS and EOS, and more than n_triggers + 2 ordinary tokens are needed, so "
                                 f"vocab_size must be at least {n_triggers + 5}")
            if self.eval.blimp_path is not None:
                raise ValueError("eval.blimp_path must be unset with data.task 'bigram_backcopy': BLiMP scores English "
                                 "sentences through a text tokenizer, and the synthetic task has neither")
            if self.eval.budget is not None and self.eval.budget.bytes is not None:
                raise ValueError("eval.budget.bytes counts the held-out text's UTF-8 bytes, which data.task "
                                 "'bigram_backcopy' does not have: use eval.budget.documents (its sequences)")
        return self

    def with_train(self, **changes) -> ExperimentConfig:
        """This experiment with some `train` keys changed (settings chosen in code, not a user's overrides)."""
        return self.model_copy(update={"train": self.train.model_copy(update=changes)})

    def _check_trained_bpe(self) -> None:
        """The trained BPE's settings; a tokenizer file or Hub name is checked when the experiment is resolved
        (gatelab.data.resolve), since that reads the file."""
        if self.model.vocab_size == "auto":
            raise ValueError("model.vocab_size 'auto' needs data.tokenizer to be a tokenizer.json or a "
                             "Hugging Face name: with data.tokenizer 'bpe' the BPE is trained to model.vocab_size, "
                             "so give an integer")
        if self.data.bos_token is not None or self.data.eos_token is not None:
            raise ValueError("data.bos_token and data.eos_token apply to a tokenizer.json or Hugging Face "
                             "data.tokenizer; with 'bpe' documents are framed by <|bos|> and <|eos|>: unset them")


# --- validation error messages --------------------------------------------------------------------------------------


def submodel_of(annotation: Any) -> type[BaseModel] | None:
    """The BaseModel class inside an annotation such as `MoEConfig | None` or `list[GateConfig]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = submodel_of(arg)
        if found is not None:
            return found
    return None


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    current: type[BaseModel] | None = root
    for part in loc:
        if current is None:
            return None
        if isinstance(part, int) or part not in current.model_fields:
            continue  # list indices and union tags
        current = submodel_of(current.model_fields[part].annotation)
    return current


def _describe(error: dict[str, Any], root: type[BaseModel]) -> str:
    loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and p[:1].isupper()))  # drop union tags
    path = ".".join(str(p) for p in loc) or "(top level)"
    if error["type"] == "extra_forbidden":
        parent = _model_at(root, loc[:-1])
        valid = sorted(parent.model_fields) if parent else []
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return f"{path}: unknown key{hint} (valid keys: {', '.join(valid)})"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] not in ("value_error", "missing") and "input" in error:
        message += f" (got {_shortened(repr(error['input']))})"
    return f"{path}: {message}" if loc else message  # a whole-experiment check names its keys itself


def _shortened(text: str, limit: int = 200) -> str:
    """A value as a message quotes it: a YAML value's text can run to megabytes."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def format_validation_error(error: ValidationError, source: str, root: type[BaseModel] = ExperimentConfig) -> str:
    lines = [f"{source}: invalid configuration"]
    lines += [f"  {_describe(e, root)}" for e in error.errors()]
    return "\n".join(lines)


def validate_experiment(data: dict[str, Any], source: str) -> ExperimentConfig:
    """The experiment `data` describes, its values and types checked; not yet resolved (gatelab.data.resolve)."""
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        raise GatelabError(format_validation_error(exc, source)) from None


def flatten(config: BaseModel | dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"model": {"n_layers": 4}}` -> `{"model.n_layers": 4}`, for MLflow params and tables."""
    tree = config.model_dump(mode="json") if isinstance(config, BaseModel) else config
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def setting_warnings(experiment: ExperimentConfig) -> list[str]:
    """Settings that a run accepts but that make it mean less than its user thinks, each with its fix. Warnings, not
    errors: a deliberate short run (a smoke test, a timing) may want them."""
    train, steps = experiment.train, experiment.train.max_steps
    lines = []
    if train.warmup_steps >= steps:
        peak = train.lr * steps / train.warmup_steps
        lines.append(f"train.warmup_steps ({train.warmup_steps}) is not below train.max_steps ({steps}): the learning "
                     f"rate is still warming up when the run ends (it reaches {peak:.3g}, not lr {train.lr:g}, and "
                     f"never decays); set train.warmup_steps below max_steps, e.g. "
                     f"--set train.warmup_steps={max(1, steps // 10)}")
    if train.log_every > steps:
        lines.append(f"train.log_every ({train.log_every}) is above train.max_steps ({steps}): no training loss is "
                     f"logged and the loss curves stay empty; set train.log_every at most max_steps, e.g. "
                     f"--set train.log_every={max(1, steps // 10)}")
    every = experiment.eval.every_n_steps
    if every is not None and every > steps:
        lines.append(f"eval.every_n_steps ({every}) is above train.max_steps ({steps}): no validation runs during "
                     f"training; set it at most max_steps, or leave it unset for the end-of-run evaluation alone")
    return ["warning: " + line for line in lines]
