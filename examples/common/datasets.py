"""The shipped datasets' shared code, and how the examples load a dataset.

The datasets of `examples/data/` are TFDS builders over text that ships
with the repository (a gzipped TSV file), is generated in code, or is read
from an installed Debian package: nothing is downloaded. What they share
lives here: the split of an example (by a hash of its key, or by its
index), the shipped TSV files, the `full` / `tiny` configurations and a
base builder.

The examples name their dataset with `--dataset`: a shipped one (its
module registers its builder when imported; it is prepared from the
repository) or any TFDS dataset (prepared in `--data-dir` already, or
fetched with `--download`). `prepared_builder` and `split_names` load
either kind the same way.
"""

import csv
import gzip
import importlib
import os
import zlib

import tensorflow_datasets as tfds

DATA_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data"
)
# Dataset name -> module of `examples/data` that registers its builder.
SHIPPED = {
    name: f"examples.data.{name}"
    for name in (
        "freedict_deu_eng",
        "kjv_bible",
        "multilingual_dates",
        "wordnet_glosses",
    )
}
SPLITS = ("train", "validation", "test")
TINY_STRIDE = 20


def split_of_index(index, buckets):
    """`"test"` for bucket 0, `"validation"` for 1, else `"train"`, where
    the bucket is `index % buckets` (`1 / buckets` of the examples test,
    as many validate)."""
    bucket = index % buckets
    return "test" if bucket == 0 else "validation" if bucket == 1 else "train"


def split_of_key(key, buckets):
    """The split of an example by the CRC-32 of its string `key`: stable
    across runs and machines, and the same for every example sharing the
    key (see `split_of_index`)."""
    return split_of_index(zlib.crc32(key.encode("utf-8")), buckets)


def data_file(name):
    """Path of a file shipped in `examples/data/`."""
    return os.path.join(DATA_DIR, name)


def read_tsv(path):
    """Yields the rows (lists of strings) of a gzipped tab-separated file."""
    with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
        yield from csv.reader(f, delimiter="\t")


def write_tsv(path, rows):
    """Writes `rows` as a gzipped tab-separated file; returns their count."""
    rows = list(rows)
    with gzip.open(path, "wt", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerows(rows)
    return len(rows)


def full_and_tiny_configs():
    """`full` (every example; the default) and `tiny` (every
    `TINY_STRIDE`-th example) builder configurations."""
    return [
        tfds.core.BuilderConfig(name="full", description="All examples."),
        tfds.core.BuilderConfig(
            name="tiny",
            description=f"Every {TINY_STRIDE}th example, for tests and smoke "
            "runs.",
        ),
    ]


class ShippedBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Base of the shipped builders: nothing is downloaded; the examples of
    each split of `SPLITS` come from `_generate_examples(split)`."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}

    def _split_generators(self, dl_manager):
        del dl_manager  # The data ship with the repository.
        return {split: self._generate_examples(split) for split in SPLITS}

    @property
    def stride(self):
        """Keep every `stride`-th example (`TINY_STRIDE` in `tiny`)."""
        config = self.builder_config
        return TINY_STRIDE if config and config.name == "tiny" else 1


def tfds_name(dataset, tiny=False):
    """The TFDS name to load: `dataset/tiny` when `tiny` and the dataset has
    a `tiny` configuration, else `dataset` (its default configuration)."""
    if not tiny:
        return dataset
    configs = tfds.builder_cls(dataset).BUILDER_CONFIGS or ()
    return f"{dataset}/tiny" if "tiny" in [c.name for c in configs] else dataset


def prepared_builder(dataset, data_dir=None, download=False, tiny=False):
    """A prepared TFDS builder of `dataset`.

    Args:
        dataset: a name of `SHIPPED` (its builder is registered by importing
            its module and prepared from the repository, without network)
            or of any TFDS dataset.
        data_dir: the TFDS data directory (TFDS's default if None).
        download: let TFDS download and prepare a dataset that is not
            shipped; without it, such a dataset must already be prepared in
            `data_dir`.
        tiny: the dataset's `tiny` configuration, if it has one.

    Returns:
        a `tfds.core.DatasetBuilder` ready for `as_dataset`.
    """
    name, prepare = dataset, download
    if dataset in SHIPPED:
        importlib.import_module(SHIPPED[dataset])  # registers the builder
        name, prepare = tfds_name(dataset, tiny), True
    builder = tfds.builder(name, data_dir=data_dir)
    if prepare:
        builder.download_and_prepare()
    elif not builder.is_prepared():
        raise ValueError(
            f"The TFDS dataset {name!r} is not prepared in "
            f"{builder.data_dir!r}. Pass --download to fetch it, or "
            f"--data-dir where it is prepared. Received: dataset={dataset!r}"
        )
    return builder


def as_dataset(builder, split, **kwargs):
    """`builder.as_dataset(split=split, **kwargs)` without TFDS's automatic
    in-memory cache.

    TFDS caches a small dataset's examples when first read; the examples
    cache their tokenized pipelines themselves (`text.make_batches`), so
    TFDS's copy of the raw strings only takes memory, and reading part of
    it (a batch to build a model, a few examples to plot) discards it with
    TensorFlow's warning "The calling iterator did not fully read the
    dataset being cached".
    """
    read_config = tfds.ReadConfig(try_autocache=False)
    return builder.as_dataset(split=split, read_config=read_config, **kwargs)


def split_names(builder, holdout_percent):
    """`[train, validation, test]` split names of a prepared builder.

    Without a `validation` split, the last `holdout_percent` of `train`
    validates (and the rest trains); without a `test` split, the
    validation split also tests.
    """
    splits = builder.info.splits
    train, validation = "train", "validation"
    if "validation" not in splits:
        cut = 100 - holdout_percent
        train, validation = f"train[:{cut}%]", f"train[{cut}%:]"
    test = "test" if "test" in splits else validation
    return [train, validation, test]
