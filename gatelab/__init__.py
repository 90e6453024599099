"""gatelab: the attention-gating ablations of Qiu et al. (2025), reproducible from a YAML file."""

__version__ = "0.1.0"
