"""Sweeps: a YAML file of axes over an experiment preset, expanded into validated, hashed RunSpecs and run from a
ledger.

`spec` reads and expands a sweep file, `plan` prices it (parameters, tokens, FLOPs, time) before anything runs,
`queue` is the Optuna-backed ledger, `worker` and `executor` run what the ledger hands out.
"""
