"""Training: the Lightning module and `run(experiment)`."""
