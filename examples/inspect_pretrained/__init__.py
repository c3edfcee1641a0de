"""`python -m examples.inspect_pretrained`: a keras-hub preset converted
to `keras_attention` blocks, checked against the original, and its
attention analysed.

- `__main__.py`: the command line, loading the preset, the conversion,
  the equality check, the outputs (explorer, heatmaps, `stats.json`).
- `stats.py`: per-head attention statistics in NumPy (entropy, attended
  distance, attention to the first and to the same token: Clark et al.,
  2019) and the heatmaps.
"""

__all__ = []
