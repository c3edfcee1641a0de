"""Text sources and `tf.data` pipelines of the `language_model` example.

Sources (each gives train / validation / test datasets of strings, one line
or verse each):

- `kjv_bible` (default): the King James Bible, shipped with the repository
  (`examples/data/kjv_bible.py`), split by chapter.
- `--text-file PATH`: any UTF-8 text, e.g. a Project Gutenberg book; its
  non-empty lines are split in order: the first 90% train, the next 5%
  validation, the last 5% test.
- any TFDS dataset with a `text` feature (e.g. `tiny_shakespeare`), prepared
  in `--data-dir` or fetched with `--download`.

The model reads characters: lines are joined with "\\n", encoded as Unicode
code points and cut into windows of `sequence_length + 1` characters
(inputs = the first `sequence_length`, targets = the last).
"""

import tensorflow as tf

from examples.common import datasets
from examples.common.text import make_batches

NEWLINE = ord("\n")


def _read_text_file(path):
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip() for line in f if line.strip()]
    n = len(lines)
    a, b = int(n * 0.9), int(n * 0.95)
    return [
        tf.data.Dataset.from_tensor_slices(part or [""])
        for part in (lines[:a], lines[a:b], lines[b:])
    ]


def load_text_splits(
    dataset="kjv_bible",
    text_file=None,
    data_dir=None,
    download=False,
    tiny=False,
):
    """`(train, validation, test)` datasets of scalar strings."""
    if text_file:
        return _read_text_file(text_file)
    builder = datasets.prepared_builder(dataset, data_dir, download, tiny)
    return [
        datasets.as_dataset(builder, s).map(lambda ex: ex["text"])
        for s in datasets.split_names(builder, holdout_percent=5)
    ]


def char_windows(lines, tokenizer, sequence_length):
    """Lines -> `(inputs, targets)` windows of `sequence_length` code points.

    Lines are joined with newlines (so the model learns where they end) and
    the character stream is cut into non-overlapping windows.
    """
    # b - lines in a chunk, t - characters
    stream = (
        lines.batch(1024)
        .map(lambda s: tokenizer(tf.strings.join([s, "\n"])).flat_values)
        .unbatch()
    )
    windows = stream.batch(sequence_length + 1, drop_remainder=True)
    return windows.map(
        lambda w: (tf.cast(w[:-1], tf.int32), tf.cast(w[1:], tf.int32)),
        num_parallel_calls=tf.data.AUTOTUNE,
    )


def batches(windows, batch_size, shuffle, seed=0, drop_remainder=None):
    """Shuffled (training) or ordered batches of equal-length windows.

    `drop_remainder` defaults to `shuffle` (training drops the last, short
    batch); pass True for evaluation batches under a Keras distribution,
    whose batch axis must divide every batch."""
    if drop_remainder is None:
        drop_remainder = shuffle
    return make_batches(
        windows,
        batch_size,
        shuffle=shuffle,
        seed=seed,
        drop_remainder=drop_remainder,
    )
