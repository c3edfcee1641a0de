"""Data of the `pretrain` example: the corpus, the vocabulary, and the
batches of each pretraining objective and of fine-tuning.

Corpus (`--corpus`): the texts of the shipped datasets' training splits,
without labels: `all` (default: both below, shuffled together),
`wordnet_glosses` (the noun definitions whose supersense `classify`
predicts: in-domain text; pretraining never sees their validation or
test split) or `kjv_bible` (the King James Bible's verses).

Every sequence is `[START]` followed by at most `max_length - 1` WordPiece
ids of the text (0 pads), in pretraining and in fine-tuning alike.
"""

import math

import keras_hub
import tensorflow as tf

from examples.classify.data import load_splits
from examples.classify.vocabulary import frequent_word_piece_vocabulary
from examples.common import datasets
from examples.common.text import RESERVED_TOKENS
from examples.common.text import UNK
from examples.common.text import make_batches

MASK = "[MASK]"
CORPORA = ("all", "wordnet_glosses", "kjv_bible")
MASK_RATE = 0.15  # BERT's share of selected tokens (80/10/10 replaced)


def corpus_texts(corpus, data_dir=None, tiny=False):
    """`(train, validation)`: datasets of the corpus's texts (strings);
    `all`: the two corpora's, interleaved at random (seeded)."""
    if corpus not in CORPORA:
        raise ValueError(
            f"`corpus` must be one of {CORPORA}. Received: corpus={corpus!r}"
        )
    if corpus == "all":
        parts = [corpus_texts(c, data_dir, tiny) for c in CORPORA[1:]]
        return tuple(
            tf.data.Dataset.sample_from_datasets(
                [p[i] for p in parts], seed=0, stop_on_empty_dataset=False
            )
            for i in range(2)
        )
    builder = datasets.prepared_builder(corpus, data_dir, tiny=tiny)
    train, validation, _ = datasets.split_names(builder, holdout_percent=5)
    return tuple(
        datasets.as_dataset(builder, s).map(lambda ex: ex["text"])
        for s in (train, validation)
    )


def make_tokenizer(texts, vocabulary_size):
    """A lowercasing `WordPieceTokenizer`: the reserved tokens, `[MASK]`,
    every character, then the most frequent words of `texts` (a dataset of
    strings; see `examples/classify/vocabulary.py`)."""
    strings = (t for b in texts.batch(4096).as_numpy_iterator() for t in b)
    words = frequent_word_piece_vocabulary(strings, vocabulary_size - 1)
    reserved = len(RESERVED_TOKENS)
    return tokenizer_of(words[:reserved] + [MASK] + words[reserved:])


def tokenizer_of(vocabulary):
    """The example's `WordPieceTokenizer` over `vocabulary` (a list of
    strings, as `tokenizer.get_vocabulary()` returns it)."""
    return keras_hub.tokenizers.WordPieceTokenizer(
        vocabulary=vocabulary,
        lowercase=True,
        oov_token=UNK,
        special_tokens=[*RESERVED_TOKENS, MASK],
    )


def encode(ds, tokenizer, max_length, min_length=3):
    """Strings (or `(string, label)` pairs) -> `[START] + ids`, int32, at
    most `max_length` long, unpadded; shorter than `min_length`: dropped."""
    start = tokenizer.token_to_id(RESERVED_TOKENS[2])

    def ids_of(texts):  # tokenizing whole batches is much faster
        ids = tf.cast(tokenizer(texts)[:, : max_length - 1], tf.int32)
        first = tf.fill([ids.nrows(), 1], start)
        ids = tf.concat([first, ids], axis=1)
        return ids.to_tensor(0), tf.cast(ids.row_lengths(), tf.int32)

    def trim(ids, length):
        return ids[:length]

    if isinstance(ds.element_spec, tuple):
        out = (
            ds.batch(1024)
            .map(lambda t, y: (*ids_of(t), tf.cast(y, tf.int32)))
            .unbatch()
            .map(lambda ids, n, y: (trim(ids, n), y))
        )
        return out.filter(lambda ids, y: tf.size(ids) >= min_length)
    out = ds.batch(1024).map(ids_of).unbatch().map(trim)
    return out.filter(lambda ids: tf.size(ids) >= min_length)


def encode_texts(texts, tokenizer, max_length):
    """A few strings -> `[START] + ids`, int32 NumPy `(batch, T)`, 0-padded
    to the longest."""
    ds = encode(
        tf.data.Dataset.from_tensor_slices(list(texts)),
        tokenizer,
        max_length,
        min_length=1,
    )
    return next(ds.padded_batch(len(texts)).as_numpy_iterator())


def _length_buckets(max_length):
    step = max(max_length // 6, 1)
    return list(range(step, max_length, step))


def mask_generator(tokenizer, max_length):
    """BERT's masking: 15 % of the real tokens selected, of those 80 %
    replaced by `[MASK]`, 10 % by a random token, 10 % kept."""
    return keras_hub.layers.MaskedLMMaskGenerator(
        vocabulary_size=tokenizer.vocabulary_size(),
        mask_selection_rate=MASK_RATE,
        mask_token_id=tokenizer.token_to_id(MASK),
        mask_selection_length=max(1, math.ceil(MASK_RATE * max_length)),
        unselectable_token_ids=[
            tokenizer.token_to_id(t) for t in (*RESERVED_TOKENS, MASK)
        ],
    )


def objective_batches(
    ids,
    objective,
    tokenizer,
    batch_size,
    max_length,
    shuffle,
    seed=0,
    padding="buckets",
):
    """Batches `(inputs, targets, sample_weight)` of an objective from a
    dataset of `[START] + ids` sequences (see `model.py`), padded (the
    baselines of `--pack`) as `padding` says: `"buckets"` (sequences of
    similar lengths batched together, each batch padded to its longest:
    little padding), `"batch"` (random order, each batch padded to its
    longest) or `"window"` (every sequence padded to `max_length`, as
    keras-hub's preprocessors do with their `sequence_length`):

    - `mlm`: inputs `{"token_ids", "mask_positions"}` (the masked text and
      where it was masked), targets the original ids there.
    - `clm`: inputs `{"token_ids": ids[:, :-1], "prefix_length": 0}`,
      targets `ids[:, 1:]` on the real tokens.
    - `prefix_lm`: as `clm`, with a prefix length `p` drawn uniformly in
      `1 .. length - 1` per sequence; targets after the prefix only.
    """
    batches = make_batches(
        ids,
        batch_size,
        length_fn=lambda x: tf.shape(x)[0],
        bucket_boundaries=(
            _length_buckets(max_length) if padding == "buckets" else None
        ),
        shuffle=shuffle,
        seed=seed,
    )
    if padding == "window":
        batches = batches.map(
            lambda x: tf.pad(x, [[0, 0], [0, max_length - tf.shape(x)[1]]])
        )
    elif padding not in ("buckets", "batch"):
        raise ValueError(
            "`padding` must be 'buckets', 'batch' or 'window'. "
            f"Received: padding={padding!r}"
        )
    if objective == "mlm":
        generator = mask_generator(tokenizer, max_length)

        def transform(x):
            out = generator(x)
            inputs = {
                "token_ids": tf.cast(out["token_ids"], tf.int32),
                "mask_positions": tf.cast(out["mask_positions"], tf.int32),
            }
            return inputs, out["mask_ids"], out["mask_weights"]

    else:

        def transform(x):
            # b - batch, t - positions of the inputs
            inputs, targets = x[:, :-1], x[:, 1:]
            lengths = tf.reduce_sum(tf.cast(x != 0, tf.int32), axis=1)
            if objective == "clm":
                prefix = tf.zeros_like(lengths)
            else:
                u = tf.random.uniform(tf.shape(lengths), seed=seed)
                span = tf.cast(lengths - 1, tf.float32)
                prefix = 1 + tf.cast(tf.floor(u * span), tf.int32)
                prefix = tf.minimum(prefix, lengths - 1)
            t = tf.range(tf.shape(inputs)[1])[None, :]
            # Position t predicts token t + 1: the targets of prefix-LM are
            # the tokens at prefix .. length - 1.
            weight = (targets != 0) & (t >= prefix[:, None] - 1)
            x = {"token_ids": inputs, "prefix_length": prefix}
            return x, targets, tf.cast(weight, tf.float32)

    return batches.map(transform, num_parallel_calls=tf.data.AUTOTUNE)


def pack(ids, max_length, shuffle, seed=0):
    """`[START] + ids` sequences -> rows of exactly `max_length` tokens:
    the sequences one after the other, cut at row ends (GPT's packing; no
    padding), with `segment_ids` numbering the sequence of each token
    (neighbours always differ). A dataset of `(ids, segment_ids)` pairs,
    int32 `(max_length,)` each."""
    if shuffle:
        ids = ids.shuffle(10_000, seed=seed)

    def number(index, x):
        document = tf.cast(index % (1 << 30), tf.int32)
        return x, tf.fill(tf.shape(x), document)

    tokens = ids.enumerate().map(number).unbatch()
    return tokens.batch(max_length, drop_remainder=True)


def packed_batches(
    ids, objective, tokenizer, batch_size, max_length, shuffle, seed=0
):
    """Batches of packed rows (`pack`) for `mlm` or `clm`, as
    `objective_batches` makes them, plus `"segment_ids"` in the inputs:
    MLM masks 15 % of every row; CLM predicts each next token of the same
    document (not the first token of the next one)."""
    rows = pack(ids, max_length, shuffle, seed).batch(
        batch_size, drop_remainder=True
    )
    if objective == "mlm":
        generator = mask_generator(tokenizer, max_length)

        def transform(x, segments):
            out = generator(x)
            inputs = {
                "token_ids": tf.cast(out["token_ids"], tf.int32),
                "mask_positions": tf.cast(out["mask_positions"], tf.int32),
                "segment_ids": segments,
            }
            return inputs, out["mask_ids"], out["mask_weights"]

    elif objective == "clm":

        def transform(x, segments):
            inputs = {
                "token_ids": x[:, :-1],
                "prefix_length": tf.zeros(tf.shape(x)[:1], tf.int32),
                "segment_ids": segments[:, :-1],
            }
            same = tf.equal(segments[:, 1:], segments[:, :-1])
            return inputs, x[:, 1:], tf.cast(same, tf.float32)

    else:
        raise ValueError(
            "Packed batches are for `mlm` and `clm` (prefix-LM's prefix is "
            f"per row). Received: objective={objective!r}"
        )
    return rows.map(transform, num_parallel_calls=tf.data.AUTOTUNE)


# The last `labelled_arrays`, by vocabulary and arguments: a later run in
# the same process (`main` again, with the saved tokenizer) reuses them.
_LABELLED = {}


def labelled_arrays(tokenizer, max_length, data_dir=None, tiny=False):
    """The `classify` task as NumPy arrays: `{"train", "validation",
    "test"}` -> `(ids (n, max_length) int32, 0-padded; labels (n,))`, plus
    the class names."""
    key = (tuple(tokenizer.get_vocabulary()), max_length, data_dir, tiny)
    if key not in _LABELLED:
        _LABELLED.clear()
        _LABELLED[key] = _labelled_arrays(tokenizer, max_length, data_dir, tiny)
    arrays, class_names = _LABELLED[key]
    return dict(arrays), list(class_names)


def _labelled_arrays(tokenizer, max_length, data_dir, tiny):
    import numpy as np

    *splits, class_names = load_splits("wordnet_glosses", data_dir, tiny=tiny)
    arrays = {}
    for name, ds in zip(("train", "validation", "test"), splits):
        rows = encode(ds, tokenizer, max_length, min_length=1).padded_batch(
            4096, padded_shapes=([max_length], [])
        )
        parts = list(rows.as_numpy_iterator())
        arrays[name] = (
            np.concatenate([x for x, _ in parts]).astype("int32"),
            np.concatenate([y for _, y in parts]).astype("int32"),
        )
    return arrays, class_names


def classify_batches(ds, batch_size, max_length, shuffle, seed=0):
    """Padded `(ids, label)` batches of similar lengths."""
    return make_batches(
        ds,
        batch_size,
        length_fn=lambda ids, label: tf.shape(ids)[0],
        bucket_boundaries=_length_buckets(max_length),
        shuffle=shuffle,
        seed=seed,
    )
