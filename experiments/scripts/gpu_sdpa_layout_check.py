"""Does a fused SDPA kernel on this GPU read a misaligned value view correctly? (issue 34)

    python experiments/scripts/gpu_sdpa_layout_check.py      exit 0: a kernel errs on the misaligned view; 1: none does

Each backend and layout runs in its own process: a kernel that faults (flash: "CUDA error: misaligned address")
leaves the CUDA context unusable, and counts as an error on that layout.

The layout is g1_head_sig's at repro-trained-long's sizes: one projection's output row holds q (64), k (32), v (32)
and 4 gate logits, so v's token stride is 132 elements. For each SDPA backend, the output and the gradients of q, k
and v in bf16 are compared with float64 attention on the same values, once with v as that view and once with a
contiguous copy; and once more through gatelab's `attend`, which copies misaligned views (`sdpa_layout`).
"""

from __future__ import annotations

import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from gatelab.model.attention_kinds import attend

B, T, H, K, D = 32, 128, 4, 2, 16
WIDTH = H * D + 2 * K * D + H  # q, k, v and a headwise gate's logits


def reference(q, k, v):
    q, k, v = (t.double() for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k.repeat_interleave(H // K, 1), v.repeat_interleave(H // K, 1),
                                          is_causal=True)


def errors(call, q, k, v, grad_out):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = call(q, k, v)
    out.backward(grad_out)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference(q64, k64, v64)
    ref.backward(grad_out.double())
    pairs = [(out, ref), (q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)]
    return [(a.double() - b).abs().max().item() for a, b in pairs]


BACKENDS = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}


def inputs():
    torch.manual_seed(0)
    row = torch.randn(B, T, WIDTH, device="cuda", dtype=torch.bfloat16)
    q = row[..., :H * D].reshape(B, T, H, D).transpose(1, 2).contiguous()
    k = row[..., H * D:H * D + K * D].reshape(B, T, K, D).transpose(1, 2).contiguous()
    v_view = row[..., H * D + K * D:H * D + 2 * K * D].view(B, T, K, D).transpose(1, 2)
    grad_out = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
    return q, k, v_view, grad_out


def one_case(name: str, layout: str) -> None:
    """Print the case's largest error, or 'unavailable' where the backend declines the inputs (no fault)."""
    q, k, v, grad_out = inputs()
    v = v if layout == "view" else v.contiguous()
    if name == "gatelab":
        call = attend
    else:
        def call(q_, k_, v_):
            if BACKENDS[name] is None:
                return F.scaled_dot_product_attention(q_, k_, v_, is_causal=True, enable_gqa=True)
            with sdpa_kernel([BACKENDS[name]]):
                return F.scaled_dot_product_attention(q_, k_, v_, is_causal=True, enable_gqa=True)
    try:
        result = errors(call, q, k, v, grad_out)
    except RuntimeError as error:
        if "No available kernel" in str(error):
            print("unavailable")
            return
        raise
    print(" ".join(f"{x:.4f}" for x in result))


def main() -> int:
    q, k, v_view, _ = inputs()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; v strides {v_view.stride()}")
    worst = {"view": 0.0, "copy": 0.0}
    for name in [*BACKENDS, "gatelab"]:
        for layout in ("view", "copy"):
            done = subprocess.run([sys.executable, __file__, name, layout], capture_output=True, text=True)
            line = done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else ""
            if done.returncode != 0:
                fault = (done.stderr.strip().splitlines() or ["?"])[-1][:100]
                print(f"{name:9s} {layout}: faulted ({fault})")
                worst[layout] = float("inf") if name != "gatelab" else worst[layout]
            elif line == "unavailable":
                print(f"{name:9s} {layout}: no kernel for these inputs")
            else:
                out, dq, dk, dv = map(float, line.split())
                print(f"{name:9s} {layout}: max |error| out {out:.4f}  dq {dq:.4f}  dk {dk:.4f}  dv {dv:.4f}")
                if name != "gatelab":
                    worst[layout] = max(worst[layout], out, dq, dk, dv)
    print(f"worst error: misaligned view {worst['view']:.4f}, contiguous copy {worst['copy']:.4f}")
    return 0 if worst["view"] > 10 * worst["copy"] else 1


if __name__ == "__main__":
    if len(sys.argv) == 3:
        one_case(*sys.argv[1:])
    else:
        sys.exit(main())
