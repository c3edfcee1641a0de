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
(inputs = the first `sequence_length`, targets = the last). With
`--pack` / `--documents padded` each line is a document instead
(`document_windows`): packed one after the other into full windows with
`segment_ids`, or one per window, padded.
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


def char_documents(lines, tokenizer):
    """Lines -> documents: int32 code points of `"\\n" + line + "\\n"`
    each (a document starts after a newline, as generation does, and
    ends with one, so the model learns where lines end)."""
    return (
        lines.batch(1024)
        .map(lambda s: tokenizer(tf.strings.join(["\n", s, "\n"])))
        .unbatch()
        .map(lambda d: tf.cast(d, tf.int32))
    )


def packed_windows(documents, sequence_length):
    """Documents -> packed `({"token_ids", "segment_ids"}, targets,
    weights)` windows of `sequence_length` (`--pack`).

    The documents are put one after the other and cut into rows of
    `sequence_length + 1` code points (no padding), `segment_ids` numbering
    the document of each token (neighbours always differ). Targets are the
    inputs shifted by one; a target's weight is 0 where it starts another
    document than its input's (a document's first character is not
    predicted from the previous document), 1 elsewhere.
    """

    def number(index, x):
        document = tf.cast(index % (1 << 30), tf.int32)
        return x, tf.fill(tf.shape(x), document)

    rows = (
        documents.enumerate()
        .map(number)
        .unbatch()
        .batch(sequence_length + 1, drop_remainder=True)
    )

    def shift(x, segments):
        inputs = {"token_ids": x[:-1], "segment_ids": segments[:-1]}
        same = tf.equal(segments[1:], segments[:-1])
        return inputs, x[1:], tf.cast(same, tf.float32)

    return rows.map(shift, num_parallel_calls=tf.data.AUTOTUNE)


def padded_windows(documents, sequence_length):
    """Documents -> padded `(inputs, targets, weights)` windows of
    `sequence_length`, one document per row (`--documents padded`).

    A document longer than a row continues on the next rows (nothing is
    dropped); its last row is padded with 0 (no code point of the text),
    and padded targets weigh 0."""
    width = sequence_length + 1

    def rows(x):
        padding = (-tf.shape(x)[0]) % width
        return tf.reshape(tf.pad(x, [[0, padding]]), (-1, width))

    def shift(x):
        targets = x[1:]
        return x[:-1], targets, tf.cast(targets != 0, tf.float32)

    return (
        documents.map(rows)
        .unbatch()
        .map(shift, num_parallel_calls=tf.data.AUTOTUNE)
    )


def document_windows(lines, tokenizer, sequence_length, documents):
    """`documents="packed"` (`packed_windows`) or `"padded"`
    (`padded_windows`) windows of the lines."""
    docs = char_documents(lines, tokenizer)
    if documents == "packed":
        return packed_windows(docs, sequence_length)
    if documents == "padded":
        return padded_windows(docs, sequence_length)
    raise ValueError(
        "`documents` must be 'packed' or 'padded'. "
        f"Received: documents={documents!r}"
    )
