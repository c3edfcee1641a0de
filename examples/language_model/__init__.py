"""`python -m examples.language_model`: a character-level transformer
language model.

- `__main__.py`: the command line, training, evaluation, completions.
- `data.py`: text sources and `tf.data` windows of characters.
- `model.py`: the decoder-only transformer, its generator and metrics.
- `export.py`: the SavedModel that completes raw strings.
- `options.py`: choices the command line lists before Keras is imported.
"""

__all__ = []
