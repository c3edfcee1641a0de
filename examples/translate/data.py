"""Data of the `translate` example: datasets, tokenizers, tf.data pipelines.

Datasets (`--dataset`):
- `multilingual_dates` (default): human-written dates in eight languages ->
  ISO 8601, generated with babel (`examples/data/multilingual_dates.py`);
  character tokens; metric: exact match.
- `freedict_deu_eng`: German -> English usage examples of the Ding
  dictionary, read from the Debian package `dict-freedict-deu-eng`
  (`examples/data/freedict_deu_eng.py`); WordPiece tokens; metric: BLEU.
- `ted_hrlr_translate/pt_to_en` (or any TFDS translation dataset with
  `as_supervised` pairs): Portuguese -> English TED talks, the dataset of
  the TensorFlow Transformer tutorial; downloaded by TFDS on first use when
  not already in `--data-dir`; WordPiece tokens; metric: BLEU.
"""

import dataclasses

import tensorflow as tf

from examples.common import datasets
from examples.common import text

DATES = "multilingual_dates"


@dataclasses.dataclass
class TranslationData:
    """Everything the models and the evaluation need about the data."""

    train: tf.data.Dataset  # batches ({"encoder_ids", "decoder_ids"}, labels)
    validation: tf.data.Dataset
    # The first validation batch, read without the in-memory cache of
    # `validation`: reading part of a cached dataset discards what it
    # cached, with TensorFlow's warning "The calling iterator did not
    # fully read the dataset being cached".
    probe: tf.data.Dataset
    test_pairs: list  # [(source, reference)] raw strings
    validation_pairs: list  # the same, of the validation split
    source_tokenizer: object
    target_tokenizer: object
    max_source_length: int
    max_target_length: int  # including the start and end tokens
    metric: str  # "exact_match" or "bleu"

    @property
    def special_ids(self):
        return text.special_ids(self.target_tokenizer)


def load_pairs(name, data_dir=None, quick=False):
    """`(train, validation, test)` datasets of `(source, target)` strings.

    `quick` loads the `tiny` configuration of a dataset that has one (the
    dates), else the first 3,000 / 200 / 200 examples of the splits. TFDS
    downloads a dataset that is neither shipped nor prepared in `data_dir`.
    """
    builder = datasets.prepared_builder(
        name, data_dir, download=True, tiny=quick
    )
    splits = list(datasets.SPLITS)
    if quick and getattr(builder.builder_config, "name", None) != "tiny":
        splits = ["train[:3000]", "validation[:200]", "test[:200]"]
    return [datasets.as_dataset(builder, s, as_supervised=True) for s in splits]


def build_tokenizers(name, train_pairs, vocabulary_size=8000):
    """Character tokenizers for dates, WordPiece for language pairs."""
    sources = train_pairs.map(lambda s, t: s)
    targets = train_pairs.map(lambda s, t: t)
    if name == DATES:
        return (
            text.character_tokenizer(sources, lowercase=True),
            text.character_tokenizer(targets),
        )
    sources, targets = sources.take(200_000), targets.take(200_000)
    return (
        text.train_word_piece(sources, vocabulary_size),
        text.train_word_piece(targets, vocabulary_size),
    )


def encode_source(tokenizer, source, max_length):
    """Token ids of one source string, truncated (no special tokens)."""
    return tokenizer(source)[:max_length]


def encode_target(tokenizer, target, max_length):
    """`[START] tokens [END]`, truncated to `max_length` ids."""
    _, start, end = text.special_ids(tokenizer)
    ids = tokenizer(target)[: max_length - 2]
    return tf.concat([[start], tf.cast(ids, "int32"), [end]], axis=0)


def make_pipelines(
    name,
    batch_size,
    max_source_length=None,
    max_target_length=None,
    data_dir=None,
    quick=False,
    vocabulary_size=8000,
    seed=0,
):
    """Loads a dataset, fits tokenizers on its training split, and returns
    a `TranslationData` with bucketed, cached, prefetched batches."""
    train, validation, test = load_pairs(name, data_dir, quick)
    source_tokenizer, target_tokenizer = build_tokenizers(
        name, train, vocabulary_size
    )
    if max_source_length is None:
        max_source_length = 48 if name == DATES else 40
    if max_target_length is None:
        max_target_length = 12 if name == DATES else 40

    def to_features(source, target):
        source_ids = tf.cast(
            encode_source(source_tokenizer, source, max_source_length),
            "int32",
        )
        target_ids = encode_target(target_tokenizer, target, max_target_length)
        features = {
            "encoder_ids": source_ids,
            "decoder_ids": target_ids[:-1],
        }
        return features, target_ids[1:]

    def batches(ds, shuffle, cache=True):
        ds = ds.map(to_features, num_parallel_calls=tf.data.AUTOTUNE)
        return text.make_batches(
            ds,
            batch_size,
            length_fn=lambda f, _: tf.shape(f["encoder_ids"])[0],
            bucket_boundaries=[8, 16, 24, 32],
            shuffle=shuffle,
            seed=seed,
            cache=cache,
        )

    def pairs(ds):
        return [
            (s.decode("utf-8"), t.decode("utf-8"))
            for s, t in ds.as_numpy_iterator()
        ]

    return TranslationData(
        train=batches(train, True),
        validation=batches(validation, False),
        probe=batches(validation, False, cache=False).take(1),
        test_pairs=pairs(test),
        validation_pairs=pairs(validation),
        source_tokenizer=source_tokenizer,
        target_tokenizer=target_tokenizer,
        max_source_length=max_source_length,
        max_target_length=max_target_length,
        metric="exact_match" if name == DATES else "bleu",
    )
