"""German-English sentence and phrase pairs from the Ding dictionary.

The Ding dictionary (TU Chemnitz, GPL-2+), as packaged by FreeDict for
Debian (`dict-freedict-deu-eng`, GPL-3+/AGPL-3+), gives its entries with
usage examples translated by people, e.g.

      "Ich habe keine Ahnung."  - I have no idea.

This builder reads them from the package's installed files; nothing is
copied into this repository. Install the package with

    sudo apt-get install dict-freedict-deu-eng

(or point `FREEDICT_DIR` at a directory holding `freedict-deu-eng.dict.dz`,
e.g. unpacked from https://freedict.org/downloads/). About 30,000 pairs are
kept: examples without alternatives ("er/sie"), ellipses or placeholders
("jdm.", "sb."), at most 20 words, with the first English translation when
several are given. Splits are by a
hash of the German text (90% train, 5% validation, 5% test).
"""

import gzip
import os
import re

import tensorflow_datasets as tfds

from examples.common import datasets

FREEDICT_DIR = os.environ.get("FREEDICT_DIR", "/usr/share/dictd")
DICT_FILE = "freedict-deu-eng.dict.dz"
MAX_WORDS = 20

_EXAMPLE = re.compile(r'^\s+"(?P<de>[^"]+)"\s+- (?P<en>.+)$')
# Several English translations: "I have a hunch., Something tells me."
_ALTERNATIVES = re.compile(r"(?<=[.!?]), (?=[A-Z])")
_UNWANTED = re.compile(r"[/…{}<>\[\]]|\.\.\.|\bjd[mns]?\.|\bsb\.|\bsth\.")


def dict_path(directory=None):
    path = os.path.join(directory or FREEDICT_DIR, DICT_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} not found. Install the Debian package with "
            "`sudo apt-get install dict-freedict-deu-eng`, or set "
            "FREEDICT_DIR to a directory holding freedict-deu-eng.dict.dz."
        )
    return path


def parse_examples(lines):
    """Yields `(german, english)` usage examples of a dictd text stream."""
    for line in lines:
        match = _EXAMPLE.match(line.rstrip("\n"))
        if match is None:
            continue
        de = match.group("de").strip()
        en = _ALTERNATIVES.split(match.group("en").strip())[0].strip()
        if not de.endswith((".", "!", "?")):
            # A phrase: its translations are listed "a garden, a yard".
            en = en.split(", ")[0].strip()
        if not de or not en or _UNWANTED.search(de) or _UNWANTED.search(en):
            continue
        if len(de.split()) > MAX_WORDS or len(en.split()) > MAX_WORDS:
            continue
        yield de, en


def read_pairs(directory=None):
    """Sorted unique `(german, english)` pairs from the installed package."""
    # The .dict.dz file is dictzip: a gzip file readable as a whole.
    with gzip.open(dict_path(directory), "rt", encoding="utf-8") as f:
        pairs = {}
        for de, en in parse_examples(f):
            pairs.setdefault(de, en)  # The first translation of a sentence.
    return sorted(pairs.items())


def split_of(german):
    """Split of a pair: 5% test, 5% validation, by a hash of the German."""
    return datasets.split_of_key(german, 20)


class FreedictDeuEng(datasets.ShippedBuilder):
    """German-English usage examples of the Ding/FreeDict dictionary."""

    RELEASE_NOTES = {"1.0.0": "Initial release (FreeDict deu-eng 2022.04)."}

    def _info(self):
        return self.dataset_info_from_configs(
            description=__doc__,
            features=tfds.features.FeaturesDict(
                {"de": tfds.features.Text(), "en": tfds.features.Text()}
            ),
            supervised_keys=("de", "en"),
            homepage="https://freedict.org/",
            license="GPL-3.0-or-later AND AGPL-3.0-or-later (FreeDict), "
            "GPL-2.0-or-later (Ding)",
        )

    def _split_generators(self, dl_manager):
        self._pairs = read_pairs()  # From the installed Debian package.
        return super()._split_generators(dl_manager)

    def _generate_examples(self, split):
        for i, (de, en) in enumerate(self._pairs):
            if split_of(de) == split:
                yield i, {"de": de, "en": en}
