"""Evaluation: perplexity, long context, benchmarks, probes, quantization and lm-eval scoring of a trained model."""
