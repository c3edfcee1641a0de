"""Data of the `classify_images` example: images `(N, H, W, 1)` float32 in
[0, 1], integer labels, a fixed train/validation/test split, and `tf.data`
batches.

Datasets (`--dataset`):
- `digits` (default, offline): scikit-learn's bundled handwritten digits,
  1,797 grayscale images of 8×8 pixels (UCI "Optical Recognition of
  Handwritten Digits"), upscaled bilinearly to `--image-size`. A fixed,
  stratified split (seed 0, whatever `--seed` says): 20% test, 10% of the
  rest validation.
- `fashion_mnist`: Zalando's 70,000 28×28 clothing images through
  TensorFlow Datasets, prepared in `--data-dir` or fetched with
  `--download` (the last 10% of `train` validates; `test` tests).
"""

import numpy as np

DIGITS = "digits"
FASHION_MNIST = "fashion_mnist"
DATASETS = (DIGITS, FASHION_MNIST)
# The native size of each dataset's images (the default `--image-size` is
# computed from it, see `default_image_size`).
NATIVE_SIZE = {DIGITS: 8, FASHION_MNIST: 28}
SPLIT_SEED = 0
TEST_SHARE = 0.2
VALIDATION_SHARE = 0.1
TINY_PER_SPLIT = (200, 60, 60)


def default_image_size(dataset):
    """32 for the 8×8 digits (upscaled 4×), the native size otherwise."""
    return 32 if dataset == DIGITS else NATIVE_SIZE[dataset]


def resize(images, size):
    """`(N, h, w)` or `(N, h, w, 1)` -> `(N, size, size, 1)` float32,
    bilinear (no-op at the native size)."""
    import tensorflow as tf

    images = np.asarray(images, "float32")
    if images.ndim == 3:
        images = images[..., None]
    if images.shape[1:3] == (size, size):
        return images
    resized = tf.image.resize(images, (size, size), method="bilinear")
    return np.clip(resized.numpy(), 0.0, 1.0).astype("float32")


def stratified_split(labels, test_share, validation_share, seed=SPLIT_SEED):
    """`(train, validation, test)` index arrays: within each class, a fixed
    shuffle (by `seed`) puts `test_share` of the examples in test and
    `validation_share` of the rest in validation."""
    rng = np.random.default_rng(seed)
    parts = ([], [], [])
    for label in np.unique(labels):
        index = rng.permutation(np.flatnonzero(labels == label))
        n_test = int(round(len(index) * test_share))
        n_val = int(round((len(index) - n_test) * validation_share))
        parts[2].append(index[:n_test])
        parts[1].append(index[n_test : n_test + n_val])
        parts[0].append(index[n_test + n_val :])
    return tuple(np.sort(np.concatenate(p)) for p in parts)


def load_digits(image_size):
    """The digits as `(splits, class_names)`; `splits` is
    `[(images, labels)] * 3` (train, validation, test)."""
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError as error:
        raise ImportError(
            "--dataset digits reads scikit-learn's bundled digits: "
            "pip install scikit-learn (or the `examples` extra)"
        ) from error
    bunch = sklearn_digits()
    images = resize(bunch.images / 16.0, image_size)  # pixels are 0..16
    labels = bunch.target.astype("int32")
    splits = stratified_split(labels, TEST_SHARE, VALIDATION_SHARE)
    return (
        [(images[i], labels[i]) for i in splits],
        [str(name) for name in bunch.target_names],
    )


def load_tfds(dataset, image_size, data_dir=None, download=False):
    """A TFDS image dataset (`image`, `label`) as NumPy splits (see
    `load_digits`); `ValueError` naming `--download` when not prepared."""
    import tensorflow_datasets as tfds

    from examples.common import datasets

    builder = datasets.prepared_builder(dataset, data_dir, download)
    splits = []
    for split in datasets.split_names(builder, holdout_percent=10):
        ds = datasets.as_dataset(builder, split, as_supervised=True)
        images, labels = zip(*tfds.as_numpy(ds.batch(4096)))
        images = np.concatenate(images).astype("float32") / 255.0
        labels = np.concatenate(labels).astype("int32")
        splits.append((resize(images, image_size), labels))
    return splits, list(builder.info.features["label"].names)


def load_splits(dataset, image_size, data_dir=None, download=False, tiny=False):
    """`(splits, class_names)`: `splits` is `[(images (N, S, S, 1) float32
    in [0, 1], labels (N,) int32)]` for train, validation and test.
    `tiny` keeps the first few examples of each split (smoke runs)."""
    if dataset == DIGITS:
        splits, class_names = load_digits(image_size)
    elif dataset == FASHION_MNIST:
        splits, class_names = load_tfds(dataset, image_size, data_dir, download)
    else:
        raise ValueError(
            f"`dataset` must be one of {DATASETS}. Received: "
            f"dataset={dataset!r}"
        )
    if tiny:
        splits = [(x[:n], y[:n]) for (x, y), n in zip(splits, TINY_PER_SPLIT)]
    return splits, class_names


def batches(images, labels, batch_size, shuffle, seed=0):
    """A finite, deterministic `tf.data` dataset of `(images, labels)`
    batches (a seeded reshuffle every epoch when `shuffle`)."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((images, labels))
    if shuffle:
        ds = ds.shuffle(len(labels), seed=seed, reshuffle_each_iteration=True)
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def majority_baseline(train_labels, test_labels):
    """Accuracy of always predicting the most frequent training class."""
    majority = np.bincount(train_labels).argmax()
    return float(np.mean(test_labels == majority))
