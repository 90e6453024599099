"""Issue 41 on a GPU: peak memory and time of one layer of sigmoid and softpick attention at the small preset's shape
(B 64, H 12, K 6, T 1024, D 64, bf16 autocast), whole (`explicit_attention`, the path that kept (B, H, T, T) per
layer) against query blocks (`explicit_output`); and the 8x long-context evaluation pass (B 8, T 8192, fp32) in blocks.

    python experiments/scripts/gpu_explicit_memory_check.py
"""

from __future__ import annotations

import time

import torch

from gatelab.model.attention_kinds import explicit_attention, explicit_output


def measure(label, step):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    print(f"{label}: peak {(torch.cuda.max_memory_allocated() - base) / 1e9:.2f} GB above inputs, "
          f"{(time.perf_counter() - start) / 3 * 1e3:.1f} ms", flush=True)


def main():
    B, H, K, T, D = 64, 12, 6, 1024, 64
    for kind in ("sigmoid", "softpick"):
        q, k, v = (torch.randn(B, n, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for n in (H, K, K))
        for name, path in (("whole", lambda *a: explicit_attention(*a)[0]), ("blocks", explicit_output)):
            def step():
                with torch.autocast("cuda", torch.bfloat16):
                    y = path(q, k, v, kind)
                y.float().square().mean().backward()
            measure(f"{kind} training, one layer, {name}", step)
        B8, T8 = 8, 8 * T
        q, k, v = (torch.randn(B8, n, T8, D, device="cuda") for n in (H, K, K))
        with torch.no_grad():
            measure(f"{kind} 8x evaluation pass, one layer, blocks", lambda: explicit_output(q, k, v, kind))


if __name__ == "__main__":
    main()
