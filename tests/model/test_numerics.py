"""The numerics check (gatelab.model.numerics): every variant's training attention path against float64, and its
positive control, on a CPU with a misalignment-sensitive stand-in for SDPA's kernel, and on a GPU with the real one."""

from __future__ import annotations

import subprocess

import pytest
import torch

from gatelab.model import numerics
from gatelab.variants import VARIANTS


def _by_case(rows: list[dict]) -> dict:
    return {(r["preset"], r["variant"], r["control"]): r for r in rows}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_every_variant_is_within_twice_baseline_s_error_and_the_control_fails_on_a_misalignment_sensitive_kernel(
        dtype):
    """At tiny's widths (g1_head_sig's v is a view with token stride 388) and tiny-moe's (q/k = 8: aligned): the
    stand-in kernel shifts its output by a token when an input is misaligned, so the check passes only where
    sdpa_layout copies g1_head_sig's v, and fails where that copy is bypassed."""
    with numerics.misalignment_sensitive_sdpa():
        rows = numerics.check("cpu", dtype, ("tiny", "tiny-moe"), log=lambda line: None)
    cases = _by_case(rows)
    assert {v for (_, v, _) in cases} == set(VARIANTS)
    assert cases[("tiny", "g1_head_sig", False)]["passed"]
    assert not cases[("tiny", "g1_head_sig", True)]["passed"]
    assert ("tiny-moe", "g1_head_sig", True) not in cases  # 8 query heads: a headwise gate keeps the row aligned
    assert numerics.verdict(rows) is None, [numerics.describe(r) for r in rows if r["passed"] == r["control"]]


def test_the_stand_in_kernel_corrupts_only_misaligned_views_and_the_check_says_so_when_the_control_passes():
    """Without the stand-in a CPU's kernel reads the misaligned view right: the control passes, and the verdict says
    the check cannot see the bug there."""
    rows = numerics.check("cpu", torch.bfloat16, ("tiny",), variants=["baseline"], log=lambda line: None)
    assert [r["control"] for r in rows] == [False, True] and rows[1]["passed"]
    assert "positive control passed" in numerics.verdict(rows)


@pytest.mark.gpu
def test_on_a_gpu_every_variant_in_bf16_is_within_twice_baseline_s_error_and_the_control_fails():
    """The real kernels, every preset's widths: `python -m gatelab.model.numerics` in a test."""
    lines = []
    rows = numerics.check("cuda", torch.bfloat16, log=lines.append)
    assert numerics.verdict(rows) is None, "\n".join(lines)


def test_the_control_runs_in_a_child_process_and_a_child_that_faults_has_caught_the_bug(monkeypatch):
    """On a GPU the control runs in a process of its own: an H100's flash kernel faulted on the misaligned view
    ("misaligned address"), which loses the CUDA context. A child that reports its row is read as it is; one that dies
    is a caught bug, and the variants' rows are all there either way."""
    rows = numerics.check("cpu", torch.float32, ("tiny",), variants=["baseline", "g1_elem_sig"], log=lambda line: None,
                          control_in_child=True)
    assert [(r["variant"], r["control"]) for r in rows] == [("baseline", False), ("g1_elem_sig", False),
                                                            ("g1_head_sig", True)]
    assert rows[-1]["passed"]  # the CPU's kernel reads the view right, in the child as here
    assert rows[-1]["tolerance"] == pytest.approx(rows[0]["tolerance"])  # the child's baseline: the same input

    def faulting_child(command, **kwargs):
        assert "--control-only" in command
        return subprocess.CompletedProcess(command, 1, "", "Traceback ...\ntorch.AcceleratorError: CUDA error: "
                                                           "misaligned address\n")

    monkeypatch.setattr(numerics.subprocess, "run", faulting_child)
    rows = numerics.check("cpu", torch.float32, ("tiny",), variants=["baseline"], log=lambda line: None,
                          control_in_child=True)
    assert rows[-1]["control"] and not rows[-1]["passed"] and "misaligned address" in rows[-1]["fault"]
    assert "the kernel faulted: torch.AcceleratorError: CUDA error: misaligned address" in numerics.describe(rows[-1])
    assert numerics.verdict(rows) is None


@pytest.mark.parametrize(("argv", "says"), [
    (["--presets", "tiny,nosuch"], "--presets: nosuch is not a preset in experiments/"),
    pytest.param(["--device", "cuda"], "--device cuda: torch", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="checks the message where torch sees no CUDA GPU")),
])
def test_bad_options_end_in_one_message_before_any_check(argv, says, capsys):
    with pytest.raises(SystemExit) as exited:
        numerics.main(argv)
    assert exited.value.code == 2 and says in capsys.readouterr().err
