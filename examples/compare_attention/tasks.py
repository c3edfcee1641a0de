"""The three tasks of the study, on the `translate` example's dates.

- `dates`: the `translate` example's default data as it is: human-written
  dates in eight languages -> ISO 8601 (`multilingual_dates`), sources of
  about 6-40 characters.
- `long_dates`: the same dates hidden in long noisy sentences: random
  lowercase filler words before and after the date, the total source
  length drawn uniformly up to `LONG_MAX_LENGTH` characters, the date at a
  random place. The target is unchanged, so only the source grows: a model
  that must squeeze the source into one state (`rnn-none`) has to carry
  the date across the noise, one with attention can look it up.
- `length_generalization`: length generalisation (the shape of Bahdanau
  et al., 2015, Fig. 2): the same dates in noise, but training and
  validation sources of `LENGTH_MIN_LENGTH`-`LENGTH_TRAIN_MAX` characters
  only, test sources up to `LENGTH_TEST_MAX` characters (lengths drawn
  uniformly), so that most test sources are longer than any training
  one; the report gives accuracy by source length.

All use the `translate` example's loading, tokenizers and encoding
(`examples.translate.data`) and the shared batching (`examples.common`).
"""

import dataclasses
import random

import tensorflow as tf

from examples.common import text
from examples.compare_attention import options
from examples.translate import data as translate_data

TASKS = options.TASKS
DATES_MAX_LENGTH = 48  # as the translate example
LONG_MAX_LENGTH = 64
LONG_MIN_LENGTH = 24
LENGTH_MIN_LENGTH = 12  # length_generalization: all splits from here
LENGTH_TRAIN_MAX = 40  # training and validation sources up to here
LENGTH_TEST_MAX = 96  # test sources up to here
TARGET_LENGTH = 12  # [START] + 10 characters of YYYY-MM-DD + [END]
SYLLABLES = (
    "ka ro mi te lu sa no ve di pa zo gu ha be fi jo ne ti wa qu ly xe co ru mo"
).split()


@dataclasses.dataclass
class Task:
    """Batches for training and held-out pairs for evaluation."""

    name: str
    train_pairs: list  # [(source, reference)]
    validation_pairs: list  # early stopping (the training distribution)
    test_pairs: list
    source_tokenizer: object
    target_tokenizer: object
    max_source_length: int
    max_target_length: int
    train_max_length: int = None  # longest training source, if capped

    def batches(self, batch_size, seed=0):
        """Training batches `({"encoder_ids", "decoder_ids"}, labels)`,
        bucketed by source length, shuffled with `seed`."""
        return _pipeline(
            self.train_pairs,
            self.source_tokenizer,
            self.target_tokenizer,
            self.max_source_length,
            batch_size,
            seed,
        )


def _filler(rng, length):
    """Random lowercase words (no digits) of `length` characters in all,
    each followed by a space."""
    out = ""
    while len(out) < length:
        word = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3)))
        out += word + " "
    return out[:length]


def hide_in_noise(
    source, rng, max_length=LONG_MAX_LENGTH, min_length=LONG_MIN_LENGTH
):
    """`source` inside filler words: total length uniform in
    `[max(min_length, len(source)), max_length]`, the date at a random
    offset."""
    total = rng.randint(max(min_length, len(source)), max_length)
    noise = total - len(source)
    before = rng.randint(0, noise)
    left, right = _filler(rng, before), _filler(rng, noise - before)
    if left:
        left = left[:-1] + " "
    if right:
        right = " " + right[1:]
    return (left + source + right)[:max_length]


def _as_strings(ds):
    return [
        (s.decode("utf-8"), t.decode("utf-8"))
        for s, t in ds.as_numpy_iterator()
    ]


def _pipeline(
    pairs,
    source_tokenizer,
    target_tokenizer,
    max_source_length,
    batch_size,
    seed,
):
    sources = tf.constant([s for s, _ in pairs])
    targets = tf.constant([t for _, t in pairs])

    def to_features(source, target):
        source_ids = tf.cast(
            translate_data.encode_source(
                source_tokenizer, source, max_source_length
            ),
            "int32",
        )
        target_ids = translate_data.encode_target(
            target_tokenizer, target, TARGET_LENGTH
        )
        return {
            "encoder_ids": source_ids,
            "decoder_ids": target_ids[:-1],
        }, target_ids[1:]

    ds = tf.data.Dataset.from_tensor_slices((sources, targets))
    ds = ds.map(to_features, num_parallel_calls=tf.data.AUTOTUNE)
    step = max_source_length // 4
    return text.make_batches(
        ds,
        batch_size,
        length_fn=lambda f, _: tf.shape(f["encoder_ids"])[0],
        bucket_boundaries=[step, 2 * step, 3 * step],
        shuffle=True,
        seed=seed,
        drop_remainder=True,
    )


def load_task(name, quick=False, max_test=None, max_validation=None):
    """The `Task` `name` (one of `TASKS`). The noise of `long_dates` and
    `length_generalization` is fixed (seed 0) so that every seed and
    variant sees the same examples. `max_test` and `max_validation` keep
    the first pairs of those splits only."""
    if name not in TASKS:
        raise ValueError(f"`name` must be one of {TASKS}. Received: {name!r}")
    train, validation, test = translate_data.load_pairs(
        translate_data.DATES, quick=quick
    )
    train_pairs = _as_strings(train)
    validation_pairs = _as_strings(validation)[:max_validation]
    test_pairs = _as_strings(test)[:max_test]
    max_length, train_max = DATES_MAX_LENGTH, None
    if name == "long_dates":
        max_length = LONG_MAX_LENGTH
        rng = random.Random(0)
        train_pairs, validation_pairs, test_pairs = (
            [(hide_in_noise(s, rng), t) for s, t in pairs]
            for pairs in (train_pairs, validation_pairs, test_pairs)
        )
    if name == "length_generalization":
        max_length, train_max = LENGTH_TEST_MAX, LENGTH_TRAIN_MAX
        rng = random.Random(0)

        def noisy(pairs, longest):
            return [
                (hide_in_noise(s, rng, longest, LENGTH_MIN_LENGTH), t)
                for s, t in pairs
            ]

        train_pairs = noisy(train_pairs, train_max)
        validation_pairs = noisy(validation_pairs, train_max)
        test_pairs = noisy(test_pairs, max_length)
    source_tokenizer, target_tokenizer = translate_data.build_tokenizers(
        translate_data.DATES,
        tf.data.Dataset.from_tensor_slices(
            ([s for s, _ in train_pairs], [t for _, t in train_pairs])
        ),
    )
    return Task(
        name=name,
        train_pairs=train_pairs,
        validation_pairs=validation_pairs,
        test_pairs=test_pairs,
        source_tokenizer=source_tokenizer,
        target_tokenizer=target_tokenizer,
        max_source_length=max_length,
        max_target_length=TARGET_LENGTH,
        train_max_length=train_max,
    )
