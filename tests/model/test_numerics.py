"""The numerics check (gatelab.model.numerics): every variant's training attention path against float64, and its
positive control, on a CPU with a misalignment-sensitive stand-in for SDPA's kernel, and on a GPU with the real one."""

from __future__ import annotations

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
