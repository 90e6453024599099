# The tiny preset's whole training step (gatelab.bench.plain_step, compiled blocks), with SDPA swapped for: flash
# (as shipped), flash on fp32 copies of q/k/v, or explicit bmm + fp32 softmax; three steps interleaved in one process.
# Usage, from the repository root: python results/bench/epyc-avx512-bf16/attention_in_step.py bf16-mixed baseline 40
import sys, math, statistics, torch, torch.nn.functional as F
from gatelab.bench import plain_step, time_interleaved
try:
    from gatelab.data.resolve import load_experiment  # where it lives since issue 32
except ImportError:
    from gatelab.config import load_experiment
import gatelab.model.attention as A
torch._dynamo.config.recompile_limit = 64
precision = sys.argv[1]; variant = sys.argv[2] if len(sys.argv) > 2 else "baseline"
MODE = {"m": "flash"}
class Shim:
    def __getattr__(self, n): return getattr(F, n)
    @staticmethod
    def scaled_dot_product_attention(q, k, v, is_causal, enable_gqa):
        mode = MODE["m"]
        if mode == "flash":
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=enable_gqa)
        if mode == "flash32":
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=is_causal, enable_gqa=enable_gqa).to(q.dtype)
        B, H, T, D = q.shape; K = k.shape[1]
        q5 = q.view(B, K, H // K, T, D)
        s = (q5 @ k.unsqueeze(2).transpose(-2, -1)).float() * (1 / math.sqrt(D))
        m = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        p = s.masked_fill(~m, float("-inf")).softmax(-1)
        return (p.to(v.dtype) @ v.unsqueeze(2)).view(B, H, T, D)
A.F = Shim()
exp = load_experiment("experiments/tiny.yaml", [f"variant={variant}"])
steps = {}
for m in ("flash", "flash32", "explicit"):
    inner = plain_step(exp, precision)
    def step(inner=inner, m=m):
        MODE["m"] = m
        inner()
    steps[m] = step
t = time_interleaved(steps, 4, int(sys.argv[3]) if len(sys.argv) > 3 else 30)
for m, s in t.items():
    print(m, precision, variant, f"{statistics.median(s)*1e3:.1f} ms", flush=True)
