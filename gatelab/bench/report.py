"""What `gatelab bench` measured: the report it fills part by part, which bench.json holds as it is."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepFigures:
    """Median step time of one thing measured, with what it is relative to."""

    preset: str
    label: str  # e.g. "baseline", "g1_elem_sig", "plain fp32", "lightning"
    precision: str
    step_s: float
    tokens_per_s: float
    steps: int
    ratio: float | None = None  # to the row named in `ratio_to`
    ratio_to: str | None = None
    spread: float = 0.0  # (p90 - p10) / median of the timed steps
    flops_ratio: float | None = None  # a variant's model FLOPs per step to baseline's: the ratio its extra work sets
    ratio_interval: tuple[float, float] | None = None  # 95% bootstrap interval of `ratio` (see `timing.ratio_interval`)


@dataclass
class GemmFigures:
    preset: str
    precision: str
    model_flops_per_step: float
    achieved_flops_per_s: float
    gemm_flops_per_s: float  # this machine's matmul rate on the step's own GEMM shapes
    gemm_s_per_step: float
    share_outside_gemm: float
    square_gemm_flops_per_s: float  # a 1024^3 GEMM, for scale
    shapes: int
    gemm_rate_share_interval: tuple[float, float] | None = None  # 95% bootstrap interval of `gemm_rate_share`

    @property
    def gemm_rate_share(self) -> float:
        """The step's model FLOP/s as a share of the rate its own GEMMs reach without the rest of the step (attention
        FLOPs count in the model's, not in the GEMMs': SDPA is not a GEMM op). Both are timed in the same interleaved
        rounds (`flops.gemm_pass`): a machine whose speed drifts by a third between minutes moved this share from 77%
        to 122% between two runs of the same code when the GEMMs were timed on their own after the steps."""
        return self.achieved_flops_per_s / self.gemm_flops_per_s


@dataclass
class BenchReport:
    machine: dict
    steps: list[StepFigures] = field(default_factory=list)
    gemm: list[GemmFigures] = field(default_factory=list)
    run_cost: dict = field(default_factory=dict)
    profile: dict = field(default_factory=dict)  # preset -> op_profile rows of its own step
    compile_cost: dict = field(default_factory=dict)  # preset -> compile_cost
    peer: dict = field(default_factory=dict)  # preset -> why transformers was not compared, where it was not
    numerics: dict = field(default_factory=dict)  # preset -> loss_curves
    sweep: dict = field(default_factory=dict)
    plan_seconds: float | None = None
    gpu_estimates: list[dict] = field(default_factory=list)
    gpu: dict = field(default_factory=dict)  # preset -> gpu_figures, on a GPU
    kernels: dict = field(default_factory=dict)  # preset -> variant -> gpu_profile.kernel_summary, on a GPU
    lightning_peak_gpu_gb: dict = field(default_factory=dict)  # preset -> max_memory_allocated of its Lightning steps
    notes: list = field(default_factory=list)  # what was not measured, and why
    model_flops: dict = field(default_factory=dict)  # preset -> model FLOPs a step (the plan's count)
    graphs: dict = field(default_factory=dict)  # preset -> variant -> steps.block_graphs
    complete: bool = False  # False in what `bench` saves between its parts
    checks: list[dict] = field(default_factory=list)
    command: str = ""
