"""WordNet noun definitions labelled with their semantic class (TFDS).

Each example is the definition (gloss) of one WordNet 3.0 noun synset, e.g.
"a plant or animal that is atypically small", and its label is the synset's
lexicographer file (its supersense), e.g. `noun.animal`, `noun.artifact`,
`noun.person`: 25 classes assigned by WordNet's lexicographers. The task is
to read a definition and say what kind of thing it defines.

The data ships with this repository as `wordnet_glosses.tsv.gz` (label,
synset offset, gloss). It was produced from the Debian package
`wordnet-base` by

    apt-get install wordnet-base
    python -m examples.data.wordnet_glosses --regenerate

Splits are by a hash of the synset offset: 80% train, 10% validation, 10%
test. See `wordnet_glosses_README.md` for the WordNet 3.0 license.
"""

import argparse
import os

import tensorflow_datasets as tfds

from examples.common import datasets

DATA_FILE = datasets.data_file("wordnet_glosses.tsv.gz")
WORDNET_DIR = "/usr/share/wordnet"

# Lexicographer files 04-28 (`lexnames(5WN)`); 03 (`noun.Tops`, the unique
# beginners) holds too few synsets to be a class.
NOUN_CLASSES = (
    "act",
    "animal",
    "artifact",
    "attribute",
    "body",
    "cognition",
    "communication",
    "event",
    "feeling",
    "food",
    "group",
    "location",
    "motive",
    "object",
    "person",
    "phenomenon",
    "plant",
    "possession",
    "process",
    "quantity",
    "relation",
    "shape",
    "state",
    "substance",
    "time",
)
_FIRST_LEX_FILE = 4


def parse_data_noun(lines):
    """Parses WordNet's `data.noun` (format: `wndb(5WN)`).

    Yields `(label, offset, definition)`; the definition is the gloss without
    its quoted example sentences.
    """
    for line in lines:
        if line.startswith(" "):  # The license header.
            continue
        fields, _, gloss = line.partition(" | ")
        offset, lex_file = fields.split(" ")[:2]
        index = int(lex_file) - _FIRST_LEX_FILE
        if not 0 <= index < len(NOUN_CLASSES):
            continue
        text = definition(gloss)
        if text:
            yield NOUN_CLASSES[index], offset, text


def definition(gloss):
    """A `data.noun` gloss without its quoted example sentences."""
    parts = [p.strip() for p in gloss.strip().split(";")]
    return "; ".join(p for p in parts if p and not p.startswith('"'))


def split_of(offset):
    """Split of a synset: 10% test, 10% validation, by a hash of `offset`."""
    return datasets.split_of_key(offset, 10)


def read_glosses(path=DATA_FILE):
    """Yields `(label, offset, definition)` from the shipped TSV file."""
    for label, offset, text in datasets.read_tsv(path):
        yield label, offset, text


def regenerate(path=DATA_FILE, wordnet_dir=WORDNET_DIR):
    """Rebuilds the shipped file from an installed WordNet database."""
    with open(os.path.join(wordnet_dir, "data.noun"), encoding="utf-8") as f:
        return datasets.write_tsv(path, parse_data_noun(f))


class WordnetGlosses(datasets.ShippedBuilder):
    """WordNet noun definitions -> one of 25 supersenses."""

    BUILDER_CONFIGS = datasets.full_and_tiny_configs()

    def _info(self):
        return self.dataset_info_from_configs(
            description=__doc__,
            features=tfds.features.FeaturesDict(
                {
                    "text": tfds.features.Text(),
                    "label": tfds.features.ClassLabel(names=list(NOUN_CLASSES)),
                }
            ),
            supervised_keys=("text", "label"),
            homepage="https://wordnet.princeton.edu/",
        )

    def _generate_examples(self, split):
        for i, (label, offset, text) in enumerate(read_glosses()):
            if split_of(offset) == split and i % self.stride == 0:
                yield offset, {"text": text, "label": label}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--regenerate",
        action="store_true",
        help="rebuild the shipped file from an installed WordNet",
    )
    parser.add_argument("--wordnet-dir", default=WORDNET_DIR)
    args = parser.parse_args()
    if args.regenerate:
        count = regenerate(wordnet_dir=args.wordnet_dir)
        print(f"wrote {count} glosses to {DATA_FILE}")
