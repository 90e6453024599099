"""Does a fused SDPA kernel on this GPU read a misaligned value view correctly? (issue 34)

    python experiments/gpu_sdpa_layout_check.py      exit 0: a kernel errs on the misaligned view; 1: none does

The layout is g1_head_sig's at repro-trained-long's sizes: one projection's output row holds q (64), k (32), v (32)
and 4 gate logits, so v's token stride is 132 elements. For each SDPA backend, the output and the gradients of q, k
and v in bf16 are compared with float64 attention on the same values, once with v as that view and once with a
contiguous copy; and once more through gatelab's `attend`, which copies misaligned views (`sdpa_layout`).
"""

from __future__ import annotations

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


def main() -> int:
    torch.manual_seed(0)
    row = torch.randn(B, T, WIDTH, device="cuda", dtype=torch.bfloat16)
    q = row[..., :H * D].reshape(B, T, H, D).transpose(1, 2).contiguous()
    k = row[..., H * D:H * D + K * D].reshape(B, T, K, D).transpose(1, 2).contiguous()
    v_view = row[..., H * D + K * D:H * D + 2 * K * D].view(B, T, K, D).transpose(1, 2)
    grad_out = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; v strides {v_view.stride()}")
    worst_view, worst_copy = 0.0, 0.0
    backends = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    for name, backend in backends.items():
        def call(q_, k_, v_):
            if backend is None:
                return F.scaled_dot_product_attention(q_, k_, v_, is_causal=True, enable_gqa=True)
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q_, k_, v_, is_causal=True, enable_gqa=True)
        for layout, v in (("view", v_view), ("copy", v_view.contiguous())):
            try:
                out, dq, dk, dv = errors(call, q, k, v, grad_out)
            except RuntimeError as error:
                print(f"{name:9s} {layout}: not available ({str(error).splitlines()[0][:90]})")
                continue
            print(f"{name:9s} {layout}: max |error| out {out:.4f}  dq {dq:.4f}  dk {dk:.4f}  dv {dv:.4f}")
            if layout == "view":
                worst_view = max(worst_view, out, dq, dk, dv)
            else:
                worst_copy = max(worst_copy, out, dq, dk, dv)
    fixed = errors(lambda q_, k_, v_: attend(q_, k_, v_), q, k, v_view, grad_out)
    print("gatelab attend, view: max |error| out {:.4f}  dq {:.4f}  dk {:.4f}  dv {:.4f}".format(*fixed))
    print(f"worst error: misaligned view {worst_view:.4f}, contiguous copy {worst_copy:.4f}")
    return 0 if worst_view > 10 * worst_copy else 1


if __name__ == "__main__":
    sys.exit(main())
