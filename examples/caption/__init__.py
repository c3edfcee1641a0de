"""`python -m examples.caption`: image captioning with visual attention on
strings of handwritten digits.

- `__main__.py`: the command line, training of both decoders, decoding,
  the metrics and tables, the pictures, the explorer and the export.
- `data.py`: the digit pools, the canvases, the split by composition,
  the captions as token ids, `tf.data`.
- `model.py`: the CNN encoder, Show, Attend and Tell and the transformer
  decoder with their greedy decoding, `DoublyStochasticPenalty`.
- `plots.py`: each generated word's attention over the image (PNG).
- `export.py`: the image-in, caption-out SavedModel.
"""

__all__ = []
