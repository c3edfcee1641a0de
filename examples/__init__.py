"""Runnable examples of `keras_attention`, one folder each, run from the
repository root (`python -m examples.<name>`); not part of the installed
package."""

__all__ = []
