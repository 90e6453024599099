# Causal GQA attention alone at the tiny preset's shapes (B 16, H 4, K 2, T 256, Dk 48), forward + backward, eager and
# torch.compile: SDPA's CPU flash kernel against explicit bmm + fp32 softmax. Usage: python attention_alone.py
import time, torch, torch.nn.functional as F, math
torch.manual_seed(0)
B, H, K, T, D = 16, 4, 2, 256, 48
def run(fn, dtype, n=20):
    q = torch.randn(B, H, T, D, dtype=dtype, requires_grad=True)
    k = torch.randn(B, K, T, D, dtype=dtype, requires_grad=True)
    v = torch.randn(B, K, T, D, dtype=dtype, requires_grad=True)
    g = torch.randn(B, H, T, D, dtype=dtype)
    for _ in range(3):
        fn(q, k, v).backward(g)
    ts = []
    for _ in range(n):
        t = time.perf_counter(); y = fn(q, k, v); t1 = time.perf_counter(); y.backward(g); ts.append((t1 - t, time.perf_counter() - t1))
    ts.sort(key=sum)
    return [x * 1e3 for x in ts[n // 2]]
def flash(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
def flash_rep(q, k, v):
    return F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True)
def explicit_f32(q, k, v):
    k = k.repeat_interleave(2, dim=1); v = v.repeat_interleave(2, dim=1)
    s = (q @ k.transpose(-2, -1)).float() / math.sqrt(D)
    m = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    p = s.masked_fill(~m, float("-inf")).softmax(-1)
    return p.to(v.dtype) @ v
def explicit_gqa(q, k, v):  # no repeat: fold the 2 query heads per kv head into the time axis
    Bq, Hq, Tq, Dq = q.shape
    q5 = q.view(Bq, K, Hq // K, Tq, Dq)
    s = (q5 @ k.unsqueeze(2).transpose(-2, -1)).float() / math.sqrt(D)
    m = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    p = s.masked_fill(~m, float("-inf")).softmax(-1)
    return (p.to(v.dtype) @ v.unsqueeze(2)).view(Bq, Hq, Tq, Dq)
fns = [("flash", flash), ("flash_rep", flash_rep), ("explicit_f32", explicit_f32), ("explicit_gqa", explicit_gqa)]
for dtype in (torch.bfloat16, torch.float32):
    for name, fn in fns:
        f, b = run(fn, dtype)
        cf, cb = run(torch.compile(fn), dtype)
        print(f"{str(dtype):15} {name:13} eager {f:6.2f}+{b:6.2f}={f+b:6.2f}   compiled {cf:6.2f}+{cb:6.2f}={cf+cb:6.2f} ms/layer", flush=True)
