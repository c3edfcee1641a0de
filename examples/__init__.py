"""Runnable examples of `keras_attention` (`python -m examples.<name>`)."""
