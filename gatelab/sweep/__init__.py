"""Sweeps: a YAML file of axes over an experiment preset, expanded into validated, hashed RunSpecs and run from a
ledger.

`sweep_file` is the file's schema, `spec` reads and expands it (`ladder`: model sizes as an axis), `plan` prices it
(parameters, tokens, FLOPs, time; `flops` counts a model's training FLOPs) before anything runs and `plan_render`
prints that price, `queue` is the Optuna-backed ledger, `worker` and `executor` run what the ledger hands out.
"""
