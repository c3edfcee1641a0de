"""`python -m examples.translate`: an attention encoder-decoder translator.

- `__main__.py`: the command line, training, evaluation, plots.
- `data.py`: datasets, tokenizers and `tf.data` pipelines.
- `model.py`: the RNN and transformer translators and their decoding.
- `export.py`: the string-in, string-out SavedModel.
- `validation.py`: early stopping on the validation exact match.
"""

__all__ = []
