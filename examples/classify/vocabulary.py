"""A fast WordPiece vocabulary for the `classify` example.

`keras_hub.tokenizers.compute_word_piece_vocabulary` runs the BERT
vocabulary learner, which took 90 s for 3,000 short texts on a loaded
2-core CPU. For a classifier, the most frequent whole words plus every
character (word-initial and `##`-continuation) are a good WordPiece
vocabulary: frequent words stay whole, rare words fall back to pieces,
nothing is out of vocabulary. Counting words takes a few seconds.
"""

import collections
import re
import unicodedata

from examples.common.text import RESERVED_TOKENS

# The split of `keras_hub` WordPiece tokenizers: whitespace and punctuation.
_WORDS = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def frequent_word_piece_vocabulary(texts, vocabulary_size, lowercase=True):
    """Reserved tokens, all characters (`c` and `##c`), then frequent words.

    Args:
        texts: iterable of `str` or `bytes` (e.g. the training split).
        vocabulary_size: int, the size of the returned vocabulary (fewer if
            the texts have fewer distinct words).
        lowercase: lowercase before counting (as the tokenizer will).

    Returns:
        a list of tokens for `keras_hub.tokenizers.WordPieceTokenizer`.
    """
    words = collections.Counter()
    for text in texts:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        text = unicodedata.normalize("NFC", text.lower() if lowercase else text)
        words.update(_WORDS.findall(text))
    chars = sorted({c for word in words for c in word})
    vocabulary = list(RESERVED_TOKENS) + chars + [f"##{c}" for c in chars]
    seen = set(vocabulary)
    for word, _ in words.most_common():
        if len(vocabulary) >= vocabulary_size:
            break
        if word not in seen:
            vocabulary.append(word)
            seen.add(word)
    return vocabulary


def word_piece_tokenizer(ds, vocabulary_size, lowercase=True):
    """A `WordPieceTokenizer` over `frequent_word_piece_vocabulary` of a
    `tf.data.Dataset` of strings."""
    import keras_hub

    texts = (t for batch in ds.batch(4096).as_numpy_iterator() for t in batch)
    return keras_hub.tokenizers.WordPieceTokenizer(
        vocabulary=frequent_word_piece_vocabulary(
            texts, vocabulary_size, lowercase
        ),
        lowercase=lowercase,
        oov_token=RESERVED_TOKENS[1],
        special_tokens=list(RESERVED_TOKENS),
    )
