"""Seconds of gatelab.train.evaluate.evaluate on one trained tiny checkpoint, in this process (gatelab from PYTHONPATH)."""
import sys, time, torch
from pathlib import Path
import gatelab
from gatelab.eval.harness import load_checkpoint, experiment_from_dict
from gatelab.config import ModelConfig
from gatelab.model import build_model
from gatelab.data.prepare import load_data
from gatelab.train.evaluate import evaluate

ckpt = sys.argv[1]
described, state = load_checkpoint(Path(ckpt))
experiment = experiment_from_dict(described["experiment"], ckpt)
model = build_model(ModelConfig.model_validate(described["model"]), seed=experiment.seed)
model.load_state_dict(state)
tokenizer, corpus, domains = load_data(experiment, log=lambda *_: None, warn=lambda *_: None)
started = time.perf_counter()
metrics, _ = evaluate(model, experiment, tokenizer, corpus, domains, ([0], [1.0]), [], log=lambda *_: None)
print(f"{gatelab.__file__} {time.perf_counter() - started:.2f} s ppl/avg {metrics['ppl/avg']:.6f} blimp {metrics['blimp/accuracy']:.6f} icl {metrics['icl/induction']:.6f} f_attn {metrics['probe/f_attn']:.8f}")
