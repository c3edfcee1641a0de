"""The King James Version of the Bible (public domain) as a TFDS dataset.

The text ships with this repository as `kjv_bible.tsv.gz` (one verse per
line: book, chapter, verse, text). It was produced from the Debian package
`bible-kjv-text` (read through its `bible` command) by

    apt-get install bible-kjv
    python -m examples.data.kjv_bible --regenerate

Splits are by chapter (every 20th chapter is `test`, the one after it
`validation`, the rest `train`), so no chapter is split across them.
See `kjv_bible_README.md` for the license.
"""

import argparse
import io
import re
import subprocess

import numpy as np
import tensorflow_datasets as tfds

from examples.common import datasets

DATA_FILE = datasets.data_file("kjv_bible.tsv.gz")

_CHAPTER = re.compile(r"^(\S.*?) (\d+)$")
_VERSE = re.compile(r"^\s+(\d+) (.*)$")


def parse_bible_listing(lines):
    """Parses the output of `bible -l<width> Gen1:1-Rev22:21`.

    Yields `(book, chapter, verse, text)`; chapter headers look like
    `"Genesis 1"`, verses like `"  1 In the beginning ..."`.
    """
    book, chapter = None, None
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            continue
        heading = _CHAPTER.match(line)
        if heading and not line.startswith(" "):
            book, chapter = heading.group(1), int(heading.group(2))
            continue
        verse = _VERSE.match(line)
        if verse is None or book is None:
            raise ValueError(f"Unexpected line in the bible listing: {line!r}")
        yield book, chapter, int(verse.group(1)), verse.group(2).strip()


def read_verses(path=DATA_FILE):
    """Yields `(book, chapter, verse, text)` from the shipped TSV file."""
    for book, chapter, verse, text in datasets.read_tsv(path):
        yield book, int(chapter), int(verse), text


def split_of(chapter_index):
    """Split of the `chapter_index`-th chapter (0-based, whole Bible)."""
    return datasets.split_of_index(chapter_index, 20)


def regenerate(
    path=DATA_FILE, command=("bible", "-l100000", "Gen1:1-Rev22:21")
):
    """Rebuilds the shipped file from the Debian `bible` command."""
    listing = subprocess.run(
        command, check=True, capture_output=True, text=True
    )
    return datasets.write_tsv(
        path, parse_bible_listing(io.StringIO(listing.stdout))
    )


class KjvBible(datasets.ShippedBuilder):
    """The King James Bible, one example per verse, split by chapter."""

    BUILDER_CONFIGS = datasets.full_and_tiny_configs()

    def _info(self):
        return self.dataset_info_from_configs(
            description=__doc__,
            features=tfds.features.FeaturesDict(
                {
                    "book": tfds.features.Text(),
                    "chapter": tfds.features.Scalar(dtype=np.int32),
                    "verse": tfds.features.Scalar(dtype=np.int32),
                    "text": tfds.features.Text(),
                }
            ),
            supervised_keys=None,
            homepage="https://packages.debian.org/bible-kjv-text",
        )

    def _generate_examples(self, split):
        chapter_index, last = -1, None
        for i, (book, chapter, verse, text) in enumerate(read_verses()):
            if (book, chapter) != last:
                chapter_index, last = chapter_index + 1, (book, chapter)
            if split_of(chapter_index) == split and i % self.stride == 0:
                yield (
                    i,
                    {
                        "book": book,
                        "chapter": chapter,
                        "verse": verse,
                        "text": text,
                    },
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--regenerate",
        action="store_true",
        help="rebuild the shipped file from Debian's `bible` command",
    )
    if parser.parse_args().regenerate:
        print(f"wrote {regenerate()} verses to {DATA_FILE}")
