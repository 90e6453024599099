"""Perplexity and BLiMP of one trained checkpoint in fp32 and under bf16 autocast on the CPU:
    python bf16_vs_fp32.py RUNS/tiny/<run>/checkpoints/last.ckpt > bf16_vs_fp32.txt
"""
import glob, sys, math, torch
from pathlib import Path
from gatelab.eval.harness import load_checkpoint
from gatelab.config import ModelConfig
from gatelab.eval.harness import experiment_from_dict
from gatelab.model import build_model
from gatelab.data.prepare import load_data
from gatelab.data.datasets import heldout_windows
from gatelab.eval.metrics import token_nll
from gatelab.eval.benchmarks import load_blimp, PACKAGED_BLIMP, sentence_logprobs

ckpt = sys.argv[1]
described, state = load_checkpoint(Path(ckpt))
experiment = experiment_from_dict(described["experiment"], ckpt)
model = build_model(ModelConfig.model_validate(described["model"]), seed=experiment.seed)
model.load_state_dict(state); model.float().eval()
tokenizer, corpus, domains = load_data(experiment, log=lambda *_: None, warn=lambda *_: None)
def nll(windows, bf16):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        return torch.cat([token_nll(model, w[:, :-1], w[:, 1:]) for w in windows.split(16)])
ppl32, ppl16, worst, mean = {}, {}, 0.0, []
for d in domains:
    w = torch.from_numpy(heldout_windows(corpus, d, experiment.data.seq_len, experiment.eval.max_windows_per_domain))
    a, b = nll(w, False), nll(w, True)
    ppl32[d], ppl16[d] = math.exp(a.mean()), math.exp(b.mean())
    worst = max(worst, (a - b).abs().max().item()); mean.append((a - b).abs().mean().item())
avg32, avg16 = sum(ppl32.values()) / len(ppl32), sum(ppl16.values()) / len(ppl16)
print(f"ppl/avg fp32 {avg32:.4f}  bf16 autocast {avg16:.4f}  relative {avg16 / avg32 - 1:+.4%}")
for d in domains:
    print(f"  {d}: fp32 {ppl32[d]:.3f} bf16 {ppl16[d]:.3f} ({ppl16[d] / ppl32[d] - 1:+.3%})")
print(f"per-token |NLL difference|: mean {sum(mean) / len(mean):.4f} nats, largest {worst:.3f} nats")
pairs = load_blimp(Path(PACKAGED_BLIMP), per_paradigm=experiment.eval.blimp_per_paradigm, seed=experiment.seed)
seqs = [[corpus.bos_id] + tokenizer.encode(p[f], add_special_tokens=False).ids for p in pairs for f in ("sentence_good", "sentence_bad")]
out = {}
for bf16 in (False, True):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        lp = sentence_logprobs(model, seqs, 16).view(-1, 2)
    out[bf16] = (lp[:, 0] > lp[:, 1])
    margin = (lp[:, 0] - lp[:, 1]).abs()
print(f"BLiMP accuracy fp32 {out[False].float().mean():.4f} bf16 {out[True].float().mean():.4f}; "
      f"pairs decided differently {(out[False] != out[True]).sum().item()} of {len(pairs)}; "
      f"median |margin| {margin.median():.3f} nats")
