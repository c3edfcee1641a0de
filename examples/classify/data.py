"""Data of the `classify` example: datasets of `(text, label)`, token ids,
`tf.data` batches and the majority-class baseline.

Datasets (`--dataset`):
- `wordnet_glosses` (default): WordNet 3.0 noun definitions labelled with
  one of 25 supersenses, shipped with the repository
  (`examples/data/wordnet_glosses.py`).
- any TFDS text classification dataset with supervised keys
  `(text, label)`, e.g. `imdb_reviews`, prepared in `--data-dir` or fetched
  with `--download`; without a validation split, the last 10% of `train`
  validates.
"""

import numpy as np
import tensorflow as tf

from examples.common import datasets
from examples.common.text import make_batches


def load_splits(dataset, data_dir=None, download=False, tiny=False):
    """`(train, validation, test, class_names)`: datasets of (text, label)."""
    builder = datasets.prepared_builder(dataset, data_dir, download, tiny)
    splits = [
        datasets.as_dataset(builder, s, as_supervised=True)
        for s in datasets.split_names(builder, holdout_percent=10)
    ]
    label_key = builder.info.supervised_keys[1]
    return (*splits, builder.info.features[label_key].names)


def tokenize_splits(splits, tokenizer, max_length):
    """`(text, label)` datasets -> `(ids, label)`: int32 token ids, at most
    `max_length` of them, unpadded."""

    def encode(texts, labels):  # tokenizing whole batches is much faster
        ids = tokenizer(texts)[:, :max_length]
        return ids.to_tensor(0), tf.cast(ids.row_lengths(), tf.int32), labels

    def trim(ids, length, label):
        return tf.cast(ids[:length], tf.int32), tf.cast(label, tf.int32)

    return [
        ds.batch(1024)
        .map(encode, num_parallel_calls=tf.data.AUTOTUNE)
        .unbatch()
        .map(trim, num_parallel_calls=tf.data.AUTOTUNE)
        for ds in splits
    ]


def batches(ds, batch_size, max_length, shuffle, seed=0):
    """Padded batches of texts of similar lengths (length buckets
    `max_length // 6` tokens wide)."""
    step = max(max_length // 6, 1)
    return make_batches(
        ds,
        batch_size,
        length_fn=lambda ids, label: tf.shape(ids)[0],
        bucket_boundaries=list(range(step, max_length, step)),
        shuffle=shuffle,
        seed=seed,
    )


def majority_baseline(train, test):
    """Accuracy of always predicting the most frequent training class."""

    def labels(ds):
        chunks = ds.map(lambda text, label: label).batch(8192)
        return np.concatenate(list(chunks.as_numpy_iterator())).astype(int)

    train_labels, test_labels = labels(train), labels(test)
    majority = np.bincount(train_labels).argmax()
    return float(np.mean(test_labels == majority))
