"""Evaluation and probes. The init-scale metric's name lives here, apart from the torch modules, so that the claims
table (gatelab.report.claims) can read it without importing torch."""

# The attention sublayer's output RMS at step 0, mean over layers: logged by every run (gatelab.train.module, through
# gatelab.eval.probes.attention_output_rms) and read by the claims table's init-scale rule.
INIT_SCALE_METRIC = "init/attn_output_rms"
