"""`python -m examples.classify`: text classification with attention
pooling.

- `__main__.py`: the command line, training, evaluation, plots.
- `data.py`: datasets, tokenization and `tf.data` batches.
- `vocabulary.py`: a fast WordPiece vocabulary.
- `model.py`: the encoder and `AttentionPooling` classifier.
- `export.py`: the SavedModel that classifies raw strings.
"""

__all__ = []
