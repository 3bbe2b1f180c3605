"""Masked diffusion language models: a bidirectional runtime, static decoding and FreeDave."""
