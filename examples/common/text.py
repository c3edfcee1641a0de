"""Tokenizers and `tf.data` batching shared by the examples.

Tokenizers are `keras_hub` tokenizers (Keras layers running TensorFlow text
ops), so the same object tokenizes inside `tf.data.Dataset.map` and inside an
exported SavedModel's serving graph.
"""

import tensorflow as tf

PAD, UNK, START, END = "[PAD]", "[UNK]", "[START]", "[END]"
RESERVED_TOKENS = [PAD, UNK, START, END]


def train_word_piece(
    ds,
    vocabulary_size,
    lowercase=True,
    strip_accents=False,
    reserved_tokens=RESERVED_TOKENS,
    batch_size=1024,
):
    """Computes a WordPiece vocabulary on a dataset of strings.

    Args:
        ds: `tf.data.Dataset` of scalar strings (the training split). Not a
            Python list: `compute_word_piece_vocabulary` reads a list as file
            names.
        vocabulary_size: int, maximum vocabulary size.
        lowercase, strip_accents: text normalization, used both for the
            vocabulary and the returned tokenizer.
        reserved_tokens: tokens placed first (`[PAD]` must be id 0).

    Returns:
        a `keras_hub.tokenizers.WordPieceTokenizer` whose special tokens are
        `reserved_tokens`.
    """
    import keras_hub

    vocabulary = keras_hub.tokenizers.compute_word_piece_vocabulary(
        ds.batch(batch_size).prefetch(tf.data.AUTOTUNE),
        vocabulary_size=vocabulary_size,
        lowercase=lowercase,
        strip_accents=strip_accents,
        reserved_tokens=list(reserved_tokens),
    )
    return keras_hub.tokenizers.WordPieceTokenizer(
        vocabulary=vocabulary,
        lowercase=lowercase,
        strip_accents=strip_accents,
        oov_token=UNK,
        special_tokens=list(reserved_tokens),
    )


def character_tokenizer(ds, lowercase=False):
    """A Unicode code point tokenizer sized to the characters of `ds`.

    Ids are code points; 0 (NUL) pads, 2 (STX) starts and 3 (ETX) ends a
    sequence, so `special_ids` below work with it. Code points above the
    largest one seen in `ds` map to that largest id.
    """
    import keras_hub

    largest = ds.map(
        lambda s: tf.reduce_max(tf.strings.unicode_decode(s, "UTF-8"))
    ).reduce(tf.constant(127, tf.int32), tf.maximum)
    return keras_hub.tokenizers.UnicodeCodepointTokenizer(
        lowercase=lowercase, vocabulary_size=int(largest) + 1
    )


def special_ids(tokenizer):
    """`(pad_id, start_id, end_id)` of a tokenizer made by this module."""
    if hasattr(tokenizer, "token_to_id") and hasattr(tokenizer, "vocabulary"):
        if tokenizer.vocabulary is not None and not isinstance(
            tokenizer.vocabulary, int
        ):
            return tuple(tokenizer.token_to_id(t) for t in (PAD, START, END))
    return 0, 2, 3


def id_to_tokens(tokenizer, ids):
    """Readable token strings of a 1-D id sequence (for plots)."""
    pad, start, end = special_ids(tokenizer)
    names = {pad: "<pad>", start: "<s>", end: "</s>"}
    tokens = []
    for i in ids:
        i = int(i)
        if i in names:
            tokens.append(names[i])
        else:
            token = tokenizer.id_to_token(i)
            tokens.append("␣" if token == " " else token)
    return tokens


def make_batches(
    ds,
    batch_size,
    length_fn=None,
    bucket_boundaries=None,
    shuffle=True,
    shuffle_buffer=20000,
    seed=0,
    cache=True,
    drop_remainder=False,
):
    """Shuffle, bucket (or pad) by length, batch, cache and prefetch.

    Args:
        ds: dataset of (nested) examples of variable-length 1-D tensors,
            already tokenized.
        batch_size: int.
        length_fn: `example -> scalar int32` length used for bucketing.
        bucket_boundaries: increasing list of lengths; with `length_fn`,
            examples are grouped into length buckets (less padding), each
            batch padded to its longest example.
        shuffle: shuffle with a fixed `seed` (reshuffled each epoch, the
            same sequence of orders for a given seed, so resumed runs see the
            same batches).
        cache: cache the tokenized examples in memory before shuffling.
        drop_remainder: drop the last partial batch (fixed batch shapes).

    Returns:
        a `tf.data.Dataset` of padded batches (padding value 0).
    """
    if cache:
        ds = ds.cache()
    if shuffle:
        ds = ds.shuffle(
            shuffle_buffer, seed=seed, reshuffle_each_iteration=True
        )
    if length_fn is not None and bucket_boundaries:
        ds = ds.bucket_by_sequence_length(
            length_fn,
            bucket_boundaries=list(bucket_boundaries),
            bucket_batch_sizes=[batch_size] * (len(bucket_boundaries) + 1),
            drop_remainder=drop_remainder,
        )
    else:
        ds = ds.padded_batch(batch_size, drop_remainder=drop_remainder)
    return ds.prefetch(tf.data.AUTOTUNE)
