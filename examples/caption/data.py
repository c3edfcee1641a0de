"""Data of the `caption` example: strings of real handwritten digits
composed on a canvas, their captions ("four one seven") as token ids, and
`tf.data` batches.

The digits are scikit-learn's bundled handwritten digits (1,797 grayscale
8x8 images, UCI "Optical Recognition of Handwritten Digits"), split once
(stratified, seed 0) into training, validation and test pools of images,
so that a test canvas is made of digit images no model trained on.

A canvas (`HEIGHT` x `WIDTH` = 16 x 64 pixels, values in [0, 1]) holds a
string of 2-5 digits, left to right: each digit from its split's pool at
a random height (0-8 pixels down), 0-3 pixels after the previous one,
the whole string at a random horizontal offset. The split is by
composition: a digit string belongs to one split only (by a hash of the
string: `split_of`), so no test caption was ever a training caption.
"""

import zlib

import numpy as np

HEIGHT, WIDTH = 16, 64
DIGIT = 8  # the digits' native size
MIN_DIGITS, MAX_DIGITS = 2, 5
MAX_GAP = 3  # pixels between two digits: 0..MAX_GAP
WORDS = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
)
PAD, START, END = 0, 1, 2
VOCABULARY = ("[PAD]", "[START]", "[END]") + WORDS
FIRST_WORD = 3  # the id of "zero"
# Decoder steps: the words, then [END].
MAX_STEPS = MAX_DIGITS + 1
SPLITS = ("train", "validation", "test")
POOL_SEED = 0
# Shares of the digit images (stratified, as `classify_images`).
TEST_SHARE, VALIDATION_SHARE = 0.2, 0.1


def split_of(digits):
    """The split a digit string belongs to, by a hash of the string: 10 %
    test, 10 % validation, the rest training (stable across runs)."""
    bucket = zlib.crc32("".join(map(str, digits)).encode()) % 10
    return "test" if bucket == 0 else "validation" if bucket == 1 else "train"


def caption(digits):
    """ "four one seven" for `[4, 1, 7]`."""
    return " ".join(WORDS[int(d)] for d in digits)


def load_pools():
    """The digit images per split: `{split: (images (n, 8, 8) float32 in
    [0, 1], labels (n,) int)}`, a fixed stratified split of the 1,797."""
    from sklearn.datasets import load_digits

    from examples.classify_images.data import stratified_split

    bunch = load_digits()
    images = (bunch.images / 16.0).astype("float32")
    labels = bunch.target.astype("int32")
    parts = stratified_split(labels, TEST_SHARE, VALIDATION_SHARE, POOL_SEED)
    return {
        split: (images[index], labels[index])
        for split, index in zip(SPLITS, parts)
    }


def compose(pool, count, split, seed):
    """`count` canvases of the compositions of `split`.

    Returns:
        `(images (count, HEIGHT, WIDTH) float32, digits)`, `digits` a list
        of int lists (each string's digits, left to right), and `boxes`
        `(count, MAX_DIGITS, 4)` int: each digit's `(top, left, bottom,
        right)` on the canvas (-1 past the string's end).
    """
    images, labels = pool
    by_label = [np.flatnonzero(labels == d) for d in range(10)]
    rng = np.random.default_rng([seed, SPLITS.index(split)])
    canvases = np.zeros((count, HEIGHT, WIDTH), "float32")
    boxes = np.full((count, MAX_DIGITS, 4), -1, "int32")
    strings = []
    while len(strings) < count:
        n = int(rng.integers(MIN_DIGITS, MAX_DIGITS + 1))
        digits = [int(d) for d in rng.integers(0, 10, n)]
        if split_of(digits) != split:
            continue
        gaps = rng.integers(0, MAX_GAP + 1, n - 1)
        width = n * DIGIT + int(gaps.sum())
        left = int(rng.integers(0, WIDTH - width + 1))
        i = len(strings)
        for k, d in enumerate(digits):
            top = int(rng.integers(0, HEIGHT - DIGIT + 1))
            image = images[rng.choice(by_label[d])]
            window = canvases[i, top : top + DIGIT, left : left + DIGIT]
            np.maximum(window, image, out=window)
            boxes[i, k] = (top, left, top + DIGIT, left + DIGIT)
            left += DIGIT + (int(gaps[k]) if k < n - 1 else 0)
        strings.append(digits)
    return canvases, strings, boxes


def encode(strings):
    """`(decoder_ids, targets)`, both `(n, MAX_STEPS)` int32: `[START]`
    and the words (teacher forcing), and the words then `[END]`; padded
    with `PAD`."""
    decoder_ids = np.zeros((len(strings), MAX_STEPS), "int32")
    targets = np.zeros((len(strings), MAX_STEPS), "int32")
    for i, digits in enumerate(strings):
        words = [FIRST_WORD + d for d in digits]
        decoder_ids[i, : len(words) + 1] = [START] + words
        targets[i, : len(words) + 1] = words + [END]
    return decoder_ids, targets


def decode(ids):
    """Caption strings of generated ids `(n, steps)`: the words up to the
    first `[END]`, special tokens dropped."""
    captions = []
    for row in np.asarray(ids):
        words = []
        for token in row:
            if token == END:
                break
            if token >= FIRST_WORD:
                words.append(VOCABULARY[int(token)])
        captions.append(" ".join(words))
    return captions


def make_splits(sizes, seed=0):
    """`{split: (images (n, HEIGHT, WIDTH, 1), strings, boxes)}` for
    `sizes = {split: n}`."""
    pools = load_pools()
    splits = {}
    for split, n in sizes.items():
        images, strings, boxes = compose(pools[split], n, split, seed)
        splits[split] = (images[..., None], strings, boxes)
    return splits


def batches(images, strings, batch_size, shuffle, seed):
    """`tf.data` of `({"image", "decoder_ids"}, targets)` batches."""
    import tensorflow as tf

    decoder_ids, targets = encode(strings)
    dataset = tf.data.Dataset.from_tensor_slices(
        ({"image": images, "decoder_ids": decoder_ids}, targets)
    )
    if shuffle:
        dataset = dataset.shuffle(
            len(images), seed=seed, reshuffle_each_iteration=True
        )
    return dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE)
