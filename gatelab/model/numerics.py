"""Every variant's training attention path in low precision against the same module in float64 on the explicit path:
a check that catches a kernel fed a layout it reads wrong (see `attention_kinds.sdpa_layout`).

    python -m gatelab.model.numerics [--device cuda] [--dtype bf16]    one line a case; exit 1 on any FAIL
    python -m gatelab.model.numerics --emulate-misaligned-kernel       on a CPU (see below)

The attention module of each preset's widths (experiments/{tiny,small,tiny-moe,small-moe}.yaml, one layer, the FFN
left out) runs as training runs it: fp32 weights under autocast (or in fp32), the fused path where its kind has one,
on the views its fused projection makes. The reference is the same weights and input in float64 on the probes'
explicit path (RoPE's product stays float32: 1e-7, far below bf16's 4e-3). Error: RMS of the difference over RMS of
the reference. Tolerance: TOLERANCE x baseline's error at the same widths and input. The positive control runs
g1_head_sig, whose v is a misaligned view at H = 4 and 12 (`attention_kinds.sdpa_layout`), with that copy bypassed:
on a kernel that reads such a view wrong the check must FAIL. A CPU's kernel reads it right: the tests put a
misalignment-sensitive stand-in in SDPA's place (`misalignment_sensitive_sdpa`).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import subprocess
import sys
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from gatelab import host
from gatelab.errors import GatelabError
from gatelab.model import attention, attention_kinds, build_model
from gatelab.model.attention import Rotary
from gatelab.variants import VARIANTS, apply_variant

PRESETS = ("tiny", "small", "tiny-moe", "small-moe")
TOLERANCE = 2.0  # times baseline's error at the same widths
BATCH, TIME = 2, 128
CONTROL = "g1_head_sig"  # a headwise G1 gate's n_heads logits make the row, and so v's token stride, misaligned


class _Explicit:
    """A probe that keeps nothing: passed to `Attention.forward`, it takes the explicit path."""

    def add(self, layer: int, name: str, tensor: torch.Tensor) -> None:
        pass


def attention_module(preset: str, variant: str, device: str) -> tuple[nn.Module, Rotary]:
    """Layer 0's attention module (and the model's RoPE) of `variant` at the preset's widths, initialised as training
    initialises it, the zero-initialised sink logits, KV biases and input-independent gate logits drawn at random (zero
    would hide them)."""
    from gatelab.data.resolve import load_experiment

    base = load_experiment(host.repo_root() / "experiments" / f"{preset}.yaml").model
    shrink = {"n_layers": 1, "vocab_size": 64}  # the FFN is not checked: a small one keeps building cheap
    if base.moe is not None:
        shrink["moe"] = base.moe.model_copy(update={"expert_hidden": 8})
    else:
        shrink["ffn_hidden"] = 8
    model = build_model(apply_variant(base.model_copy(update=shrink), variant), seed=0)
    attn = model.blocks[0].attn
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in attn.named_parameters():
            if name.endswith(("sink_logits_H", "kv_bias_key", "kv_bias_value", "logits_HD")):
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
    return attn.to(device), model.rotary.to(device)


@contextlib.contextmanager
def _switch_choices(choices: list[torch.Tensor], replay: bool):
    """Switch-Head's top-k experts recorded (the fast run), then replayed (the reference): a near-tie that rounding
    breaks the other way would change the output by a whole expert, which is not a kernel's error."""
    real, replayed = attention.top_k_mask, iter(list(choices))

    def mask(scores_BTKE: torch.Tensor, top_k: int) -> torch.Tensor:
        if replay:
            return next(replayed).to(scores_BTKE.dtype)
        choices.append(real(scores_BTKE, top_k))
        return choices[-1]

    attention.top_k_mask = mask
    try:
        yield
    finally:
        attention.top_k_mask = real


def relative_error(attn: nn.Module, rotary: Rotary, x_BTD: torch.Tensor, dtype: torch.dtype) -> float:
    """RMS(fast path in `dtype` - explicit path in float64) / RMS(explicit path in float64)."""
    device = x_BTD.device
    rope_TD = rotary.cos_sin(x_BTD.shape[1], device)
    reference, choices = copy.deepcopy(attn).double(), []
    with torch.no_grad():
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32), _switch_choices(choices, False):
            y_BTD = attn(x_BTD, rope_TD)
        with _switch_choices(choices, True):
            expected_BTD = reference(x_BTD.double(), rope_TD, probe=_Explicit())
    return ((y_BTD.double() - expected_BTD).pow(2).mean() / expected_BTD.pow(2).mean()).sqrt().item()


@contextlib.contextmanager
def layout_copy_bypassed():
    """`attend` hands SDPA its views as they come, aligned or not: the code before issue 34's fix."""
    real = attention_kinds.sdpa_layout
    attention_kinds.sdpa_layout = lambda x: x
    try:
        yield
    finally:
        attention_kinds.sdpa_layout = real


def misaligned(t: torch.Tensor) -> bool:
    return t.storage_offset() % 8 != 0 or any(stride % 8 for stride in t.stride()[:-1])


@contextlib.contextmanager
def misalignment_sensitive_sdpa():
    """SDPA as a kernel that reads misaligned views wrong (storage offset or a stride but the last not a multiple of 8
    elements): its output shifted by a token, as a kernel reading the wrong rows of v would give."""
    real = F.scaled_dot_product_attention

    def sensitive(query, key, value, *args, **kwargs):
        y = real(query, key, value, *args, **kwargs)
        return y.roll(1, dims=-2) if any(misaligned(t) for t in (query, key, value)) else y

    attention_kinds.F.scaled_dot_product_attention = sensitive
    try:
        yield
    finally:
        attention_kinds.F.scaled_dot_product_attention = real


def v_is_misaligned_view(attn) -> bool:
    """Whether `attn` hands `attend` v as a misaligned view of its fused projection (no gate or expert mix on v)."""
    view = not attn.switch or "v" not in attn.switch.projections
    view = view and not any(gate.site == "g2" for gate in attn.gates)
    return view and bool(sum(attn.widths.values()) % 8 or attn.row_blocks()["v"].start % 8)


def _control_row(preset: str, device: str, dtype: torch.dtype, x_BTD: torch.Tensor, baseline_error: float
                 ) -> dict | None:
    """The positive control at the preset's widths, in this process; None where its v is not a misaligned view."""
    attn, rotary = attention_module(preset, CONTROL, device)
    if not v_is_misaligned_view(attn):
        return None
    with layout_copy_bypassed():
        error = relative_error(attn, rotary, x_BTD, dtype)
    return {"preset": preset, "variant": CONTROL, "control": True, "error": error,
            "tolerance": TOLERANCE * baseline_error, "passed": error <= TOLERANCE * baseline_error}


def _control_in_child(preset: str, device: str, dtype: torch.dtype) -> dict | None:
    """The positive control in a process of its own: a kernel may fault on the misaligned view rather than misread it
    (an H100's flash kernel did: "misaligned address", after which the CUDA context is lost), and that must cost
    neither the variants' lines nor the other presets' controls. A child that dies has caught the bug too."""
    name = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
    child = subprocess.run([sys.executable, "-m", "gatelab.model.numerics", "--control-only", "--presets", preset,
                            "--device", device, "--dtype", name], capture_output=True, text=True, timeout=300)
    for line in reversed(child.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    if child.returncode == 0:  # no row: v is aligned at these widths
        return None
    why = (child.stderr.strip().splitlines() or [f"exit {child.returncode}"])[-1]
    return {"preset": preset, "variant": CONTROL, "control": True, "error": math.inf, "tolerance": math.nan,
            "passed": False, "fault": why[:200]}


def check(device: str = "cpu", dtype: torch.dtype = torch.bfloat16, presets=PRESETS, variants=None,
          log=print, control_in_child: bool | None = None) -> list[dict]:
    """One row a (preset, variant), then the positive control's row at the widths where its v is a misaligned view:
    error, tolerance, passed. Every variant of a preset sees the same input; baseline's error sets the tolerance. The
    controls run last, each in a child process on a GPU (`control_in_child`, default: where `device` is CUDA)."""
    rows, inputs = [], {}
    for preset in presets:
        x_BTD, baseline_error = None, None
        for variant in ["baseline", *[v for v in (variants or VARIANTS) if v != "baseline"]]:
            try:
                attn, rotary = attention_module(preset, variant, device)
            except GatelabError:
                continue  # a variant this preset cannot take (ref_add4experts needs an MoE model)
            if x_BTD is None:
                x_BTD = _input(attn, device)
            error = relative_error(attn, rotary, x_BTD, dtype)
            baseline_error = error if baseline_error is None else baseline_error
            rows.append({"preset": preset, "variant": variant, "control": False, "error": error,
                         "tolerance": TOLERANCE * baseline_error, "passed": error <= TOLERANCE * baseline_error})
            log(describe(rows[-1]))
        inputs[preset] = (x_BTD, baseline_error)
    in_child = device.startswith("cuda") if control_in_child is None else control_in_child
    for preset, (x_BTD, baseline_error) in inputs.items():
        row = (_control_in_child(preset, device, dtype) if in_child
               else _control_row(preset, device, dtype, x_BTD, baseline_error))
        if row is not None:
            rows.append(row)
            log(describe(row))
    return rows


def _input(attn: nn.Module, device: str) -> torch.Tensor:
    return torch.randn(BATCH, TIME, attn.o_proj.out_features, generator=torch.Generator().manual_seed(0)).to(device)


def _control_only(preset: str, device: str, dtype: torch.dtype) -> None:
    """`--control-only`: baseline's error (the tolerance), then the control's row as one JSON line."""
    attn, rotary = attention_module(preset, "baseline", device)
    x_BTD = _input(attn, device)
    row = _control_row(preset, device, dtype, x_BTD, relative_error(attn, rotary, x_BTD, dtype))
    if row is not None:
        print(json.dumps(row), flush=True)


def describe(row: dict) -> str:
    what = f"{row['variant']}, sdpa_layout's copy bypassed (control: must FAIL)" if row["control"] else row["variant"]
    if "fault" in row:
        return f"{row['preset']:9s} {what:58s} the kernel faulted: {row['fault']}  FAIL"
    return (f"{row['preset']:9s} {what:58s} error {row['error']:.2e}  tolerance {row['tolerance']:.2e}  "
            f"{'PASS' if row['passed'] else 'FAIL'}")


def verdict(rows: list[dict]) -> str | None:
    """None where every variant passes and every control fails; else what went wrong."""
    failed = [f"{r['preset']}/{r['variant']}" for r in rows if not r["control"] and not r["passed"]]
    controls = [r for r in rows if r["control"]]
    if failed:
        return f"FAIL: {', '.join(failed)} beyond {TOLERANCE:g}x baseline's error"
    if not controls or any(r["passed"] for r in controls):
        return "FAIL: the positive control passed: this check cannot see a misaligned-view kernel bug here"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gatelab.model.numerics", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--emulate-misaligned-kernel", action="store_true",
                        help="SDPA as a kernel that reads misaligned views wrong (misalignment_sensitive_sdpa): a "
                             "CPU's own kernel reads them right, and its positive control cannot fail")
    parser.add_argument("--control-only", action="store_true", help=argparse.SUPPRESS)  # the child of _control_in_child
    options = parser.parse_args(argv)
    if options.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {options.device}: torch {torch.__version__} sees no CUDA GPU; on a CPU give "
                     "--device cpu (with --emulate-misaligned-kernel, for a positive control that can fail there)")
    unknown = [p for p in options.presets.split(",") if not (host.repo_root() / "experiments" / f"{p}.yaml").exists()]
    if unknown:
        parser.error(f"--presets: {', '.join(unknown)} is not a preset in experiments/ (e.g. {', '.join(PRESETS)})")
    warnings.filterwarnings("ignore", "Mismatch dtype between input and weight")  # autocast's RMSNorm, as in training
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[options.dtype]
    if options.control_only:
        _control_only(options.presets, options.device, dtype)
        return 0
    name = torch.cuda.get_device_name() if options.device.startswith("cuda") else "CPU"
    print(f"torch {torch.__version__}, {name}, {options.dtype} against float64, {BATCH} x {TIME} tokens")
    with misalignment_sensitive_sdpa() if options.emulate_misaligned_kernel else contextlib.nullcontext():
        # a stand-in kernel lives in this process only: its controls run here too
        problem = verdict(check(options.device, dtype, options.presets.split(","),
                                control_in_child=False if options.emulate_misaligned_kernel else None))
    print(problem or "PASS: every variant within tolerance, and the positive control failed as it must")
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main())
