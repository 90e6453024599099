"""Evaluation and probes. The init-scale metric's name is re-exported here from the catalogue (gatelab.metrics), apart
from the torch modules, so that the claims table (gatelab.report.claims) can read it without importing torch."""

# The attention sublayer's output RMS at step 0, mean over layers: logged by every run (gatelab.train.module, through
# gatelab.eval.probes.attention_output_rms) and read by the claims table's init-scale rule.
from gatelab.metrics import INIT_SCALE as INIT_SCALE_METRIC

__all__ = ["INIT_SCALE_METRIC"]
