"""The WordNet 3.0 noun graph: synsets linked by their semantic relations,
labelled with their supersense.

Nodes are the 82,115 noun synsets of WordNet 3.0; edges are the pointers
of `data.noun` from one noun synset to another (hypernym `@`, hyponym
`~`, instance hypernym / hyponym `@i` / `~i`, member / substance / part
holonyms `#m #s #p` and meronyms `%m %s %p`, antonym `!`, derivationally
related form `+`, domain `;c ;r ;u` and domain member `-c -r -u`; the
pointers to verbs and adjectives are left out), each kept as written,
from the synset that holds it to its target. A node's label is its
lexicographer file, one of the 26 noun supersenses (`noun.Tops`,
`noun.act`, `noun.animal`, ..., `noun.time`: `lexnames(5WN)`), and its
text is its lemmas and its definition (the gloss without its quoted
example sentences), e.g. "dog, domestic dog, Canis familiaris: a member
of the genus Canis ...".

The graph ships with this repository as `wordnet_graph.npz` (compressed
NumPy arrays). It was produced from the Debian package `wordnet-base` by

    apt-get install wordnet-base
    python -m examples.data.wordnet_graph --regenerate

and is read with `load_graph()`. See `wordnet_graph_README.md` for the
WordNet 3.0 license.
"""

import argparse
import dataclasses
import os

import numpy as np

from examples.data import wordnet_glosses

DATA_FILE = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "wordnet_graph.npz"
)
WORDNET_DIR = "/usr/share/wordnet"

# The noun lexicographer files 03-28 (`lexnames(5WN)`), without `noun.`:
# `noun.Tops` (the unique beginners), then the classes of the glosses.
SUPERSENSES = ("Tops",) + wordnet_glosses.NOUN_CLASSES
FIRST_LEX_FILE = 3

# The pointer symbols of nouns (`wninput(5WN)`), in the order of the
# shipped `edge_types`.
POINTER_SYMBOLS = (
    "@",  # hypernym
    "~",  # hyponym
    "@i",  # instance hypernym
    "~i",  # instance hyponym
    "#m",  # member holonym
    "#s",  # substance holonym
    "#p",  # part holonym
    "%m",  # member meronym
    "%s",  # substance meronym
    "%p",  # part meronym
    "!",  # antonym
    "+",  # derivationally related form
    "=",  # attribute (to adjectives only)
    ";c",  # domain of synset: topic
    ";r",  # domain of synset: region
    ";u",  # domain of synset: usage
    "-c",  # member of domain: topic
    "-r",  # member of domain: region
    "-u",  # member of domain: usage
)


@dataclasses.dataclass
class WordnetGraph:
    """The noun graph.

    Attributes:
        offsets: `(N,)` int, the synsets' byte offsets in `data.noun`
            (their WordNet ids), ascending.
        labels: `(N,)` int, the supersense of each node, an index into
            `SUPERSENSES` (`lex_filenum - 3`).
        senders, receivers: `(E,)` int, edge `k` goes from node
            `senders[k]` (the synset that holds the pointer) to node
            `receivers[k]` (its target).
        edge_types: `(E,)` int, an index into `POINTER_SYMBOLS`.
        lemmas: N strings, each the synset's words joined by spaces
            (multi-word lemmas with underscores: "domestic_dog").
        definitions: N strings, the glosses without example sentences.
    """

    offsets: np.ndarray
    labels: np.ndarray
    senders: np.ndarray
    receivers: np.ndarray
    edge_types: np.ndarray
    lemmas: list
    definitions: list

    @property
    def num_nodes(self):
        return len(self.offsets)

    @property
    def num_edges(self):
        return len(self.senders)

    def name(self, node):
        """The first lemma of a node, with spaces: "domestic dog"."""
        return self.lemmas[node].split(" ")[0].replace("_", " ")

    def text(self, node):
        """The lemmas and definition: "dog, domestic dog, ...: a member
        of the genus Canis ..."."""
        words = ", ".join(
            w.replace("_", " ") for w in self.lemmas[node].split()
        )
        return f"{words}: {self.definitions[node]}"

    def texts(self):
        return [self.text(i) for i in range(self.num_nodes)]


def parse_data_noun(lines):
    """Parses WordNet's `data.noun` (format: `wndb(5WN)`).

    Yields one `(offset, lex_filenum, words, pointers, definition)` per
    synset: `words` a list of lemmas, `pointers` a list of
    `(symbol, target offset)` of the pointers to other noun synsets.
    """
    for line in lines:
        if line.startswith(" "):  # The license header.
            continue
        fields, _, gloss = line.partition(" | ")
        fields = fields.split()
        offset, lex_filenum, ss_type = fields[:3]
        if ss_type != "n":
            continue
        w_cnt = int(fields[3], 16)
        words = fields[4 : 4 + 2 * w_cnt : 2]
        at = 4 + 2 * w_cnt
        p_cnt = int(fields[at])
        pointers = []
        for k in range(p_cnt):
            symbol, target, pos, _ = fields[at + 1 + 4 * k : at + 5 + 4 * k]
            if pos == "n":
                pointers.append((symbol, int(target)))
        text = wordnet_glosses.definition(gloss)
        yield int(offset), int(lex_filenum), words, pointers, text


def build_graph(lines):
    """A `WordnetGraph` of the lines of `data.noun`."""
    synsets = list(parse_data_noun(lines))
    offsets = np.array([s[0] for s in synsets], "int64")
    if np.any(np.diff(offsets) <= 0):
        raise ValueError("data.noun must list its synsets by offset")
    labels = np.array([s[1] - FIRST_LEX_FILE for s in synsets], "int64")
    if labels.min() < 0 or labels.max() >= len(SUPERSENSES):
        raise ValueError(f"unexpected lex_filenum in {labels.min() + 3}..")
    senders, targets, types = [], [], []
    for node, (_, _, _, pointers, _) in enumerate(synsets):
        for symbol, target in pointers:
            senders.append(node)
            targets.append(target)
            types.append(POINTER_SYMBOLS.index(symbol))
    receivers = np.searchsorted(offsets, np.array(targets, "int64"))
    if np.any(offsets[receivers] != np.array(targets, "int64")):
        raise ValueError("a pointer targets a synset not in data.noun")
    return WordnetGraph(
        offsets=offsets,
        labels=labels,
        senders=np.array(senders, "int64"),
        receivers=receivers.astype("int64"),
        edge_types=np.array(types, "int64"),
        lemmas=[" ".join(s[2]) for s in synsets],
        definitions=[s[4] for s in synsets],
    )


def _blob(strings):
    text = "\n".join(strings)
    if len(text.split("\n")) != len(strings):
        raise ValueError("a string holds a newline")
    return np.frombuffer(text.encode("utf-8"), "uint8")


def _strings(blob):
    return blob.tobytes().decode("utf-8").split("\n")


def save_graph(graph, path=DATA_FILE):
    """Writes `graph` as a compressed `.npz` file."""
    np.savez_compressed(
        path,
        offsets=graph.offsets.astype("int32"),
        labels=graph.labels.astype("uint8"),
        senders=graph.senders.astype("int32"),
        receivers=graph.receivers.astype("int32"),
        edge_types=graph.edge_types.astype("uint8"),
        lemmas=_blob(graph.lemmas),
        definitions=_blob(graph.definitions),
    )


def load_graph(path=DATA_FILE):
    """The shipped graph, a `WordnetGraph` (int64 arrays)."""
    with np.load(path) as data:
        return WordnetGraph(
            offsets=data["offsets"].astype("int64"),
            labels=data["labels"].astype("int64"),
            senders=data["senders"].astype("int64"),
            receivers=data["receivers"].astype("int64"),
            edge_types=data["edge_types"].astype("int64"),
            lemmas=_strings(data["lemmas"]),
            definitions=_strings(data["definitions"]),
        )


def regenerate(path=DATA_FILE, wordnet_dir=WORDNET_DIR):
    """Rebuilds the shipped file from an installed WordNet database;
    returns the graph."""
    with open(os.path.join(wordnet_dir, "data.noun"), encoding="utf-8") as f:
        graph = build_graph(f)
    save_graph(graph, path)
    return graph


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
        graph = regenerate(wordnet_dir=args.wordnet_dir)
        print(
            f"wrote {graph.num_nodes} nodes and {graph.num_edges} edges "
            f"to {DATA_FILE}"
        )
