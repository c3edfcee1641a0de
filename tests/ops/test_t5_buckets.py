"""T5's relative-position buckets against T5's own implementations.

`relative_position_bucket` and `T5RelativeBias` (through its bias, one
value per bucket) against keras-hub's `T5MultiHeadAttention` on the
running backend and against Hugging Face's `T5Attention` (when
`transformers` is installed), over a grid of configurations:

- where T5's log ratio `log(n / max_exact) / log(max_distance /
  max_exact)` is a dyadic rational (1/2, 1/4, 3/4), so that T5's float32
  arithmetic is exact and the bucket is the exact integer (a product that
  lands on an integer, where dividing first and multiplying after matters:
  T5's order);
- everywhere else on a grid, away from integer edges (where float32
  implementations, T5's among them, may round either way);

and the arguments for which T5's function divides by zero, refused.
"""

import math

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention import scores

keras_hub = pytest.importorskip("keras_hub")
hub_attention = keras_hub.src.models.t5.t5_multi_head_attention


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


def hub_buckets(relative, bidirectional, num_buckets, max_distance):
    fn = hub_attention.T5MultiHeadAttention._relative_position_bucket
    return np_(
        fn(
            ops.convert_to_tensor(relative, "int32"),
            bidirectional=bidirectional,
            num_buckets=num_buckets,
            max_distance=max_distance,
        )
    )


def table_buckets(relative, bidirectional, num_buckets, max_distance):
    """The buckets `T5RelativeBias` uses: its bias with a table holding
    each bucket's own index (the same for every head)."""
    bias = scores.T5RelativeBias(
        num_buckets=num_buckets,
        max_distance=max_distance,
        bidirectional=bidirectional,
        num_heads=2,
    )
    bias.build(2)
    table = np.repeat(np.arange(num_buckets, dtype="float32")[:, None], 2, 1)
    bias.embeddings.assign(table)
    distance = ops.convert_to_tensor(-np.asarray(relative), "int32")
    return np_(bias.relative_bias(distance))[1].astype("int64")


def both(relative, bidirectional, num_buckets, max_distance):
    got = np_(
        scores.relative_position_bucket(
            relative, bidirectional, num_buckets, max_distance
        )
    )
    from_table = table_buckets(
        relative, bidirectional, num_buckets, max_distance
    )
    return got, from_table


def exact_log_ratio_cases():
    """`(bidirectional, num_buckets, max_distance, n, numerator,
    denominator)`: T5's ratio `log(n / e) / log(max_distance / e)` is
    `numerator / denominator` exactly (`e` the exact distances), with
    `n = e * a ** numerator` and `max_distance = e * a ** denominator`
    integers for a rational `a > 1`."""
    cases = []
    for exact in (1, 2, 3, 4, 8, 16, 32):
        for m in range(exact + 1, min(4 * exact, exact + 12) + 1):
            a = m / exact
            for num, den in ((1, 2), (1, 4), (3, 4)):
                n, distance = exact * a**num, exact * a**den
                if n != int(n) or distance != int(distance):
                    continue
                n, distance = int(n), int(distance)
                if distance > 5000 or n >= distance:
                    continue
                for bidirectional in (False, True):
                    width = 4 if bidirectional else 2
                    for extra in range(width):
                        buckets = width * exact + extra
                        cases.append(
                            (bidirectional, buckets, distance, n, num, den)
                        )
    return cases


CASES = exact_log_ratio_cases()


def test_the_grid_holds_the_issue_cases_and_integer_products():
    assert (False, 8, 9, 6, 1, 2) in CASES  # -6: bucket 6, not 5
    assert (False, 64, 50, 40, 1, 2) in CASES  # -40: bucket 48, not 47

    def lands_on_an_integer(case):
        bidirectional, buckets, _, _, num, den = case
        half = buckets // 2 if bidirectional else buckets
        return (half - half // 2) * num % den == 0

    integer = [c for c in CASES if lands_on_an_integer(c)]
    assert len(CASES) > 100 and len(integer) > 50


def test_issue_examples():
    got, from_table = both(np.array([-6]), False, 8, 9)
    assert got.tolist() == from_table.tolist() == [6]
    got, from_table = both(np.array([-40]), False, 64, 50)
    assert got.tolist() == from_table.tolist() == [48]


def test_buckets_equal_t5s_at_exact_log_ratios():
    by_config = {}
    for bidirectional, buckets, distance, n, num, den in CASES:
        half = buckets // 2 if bidirectional else buckets
        exact = half // 2
        want = min(exact + (half - exact) * num // den, half - 1)
        entries = by_config.setdefault((bidirectional, buckets, distance), {})
        entries[-n] = want
        if bidirectional:
            entries[n] = want + half
    for i, (config, entries) in enumerate(sorted(by_config.items())):
        relative = np.array(sorted(entries))
        want = [entries[r] for r in relative]
        # One shape for every config (JAX compiles each op per shape).
        padded = np.resize(relative, 16)
        got = np_(scores.relative_position_bucket(padded, *config))
        theirs = hub_buckets(padded, *config)
        got, theirs = got[: len(want)], theirs[: len(want)]
        if keras.backend.backend() != "jax":
            # T5's own is exact here (JAX's float32 log, XLA's, is not
            # correctly rounded: keras-hub on JAX may land a bucket low).
            assert theirs.tolist() == want, config
        assert got.tolist() == want, config
        if i % 16 == 0:  # the layer's table: the same function
            from_table = table_buckets(padded, *config)[: len(want)]
            assert from_table.tolist() == want, config


def _near_an_integer(relative, bidirectional, num_buckets, max_distance):
    half = num_buckets // 2 if bidirectional else num_buckets
    exact = half // 2
    n = np.abs(relative) if bidirectional else np.maximum(-relative, 0)
    with np.errstate(divide="ignore"):
        v = (
            np.log(np.maximum(n, 1) / exact)
            / math.log(max_distance / exact)
            * (half - exact)
        )
    return (n >= exact) & (np.abs(v - np.round(v)) < 1e-4)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_buckets_equal_keras_hubs_away_from_integer_edges(bidirectional):
    relative = np.arange(-300, 301)
    for buckets in (4, 5, 8, 13, 16, 32, 64):
        if buckets < (4 if bidirectional else 2):
            continue
        exact = buckets // (4 if bidirectional else 2)
        for distance in sorted({exact + 1, exact + 5, 20, 50, 128, 250}):
            if distance <= exact:
                continue
            config = (bidirectional, buckets, distance)
            keep = ~_near_an_integer(relative, *config)
            got, from_table = both(relative, *config)
            theirs = hub_buckets(relative, *config)
            np.testing.assert_array_equal(got[keep], theirs[keep], config)
            np.testing.assert_array_equal(got, from_table, config)


@pytest.mark.tf_only(
    "Hugging Face's function is backend-free (PyTorch); our buckets on "
    "every backend are compared with keras-hub's above"
)
def test_buckets_equal_hugging_faces():
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    torch = pytest.importorskip("torch")
    relative = np.arange(-300, 301)
    for bidirectional, buckets, distance, n, _, _ in CASES[:200] + [
        (True, 32, 128, 0, 0, 0),
        (False, 32, 128, 0, 0, 0),
    ]:
        theirs = t5.T5Attention._relative_position_bucket(
            torch.tensor(relative),
            bidirectional=bidirectional,
            num_buckets=buckets,
            max_distance=distance,
        ).numpy()
        keep = ~_near_an_integer(relative, bidirectional, buckets, distance)
        keep |= np.abs(relative) == n
        got, _ = both(relative, bidirectional, buckets, distance)
        np.testing.assert_array_equal(got[keep], theirs[keep])


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(num_buckets=1, bidirectional=False), "num_buckets"),
        (dict(num_buckets=3, bidirectional=True), "num_buckets"),
        (dict(num_buckets=0), "num_buckets"),
        (
            dict(num_buckets=8, max_distance=4, bidirectional=False),
            "max_distance",
        ),
        (
            dict(num_buckets=8, max_distance=2, bidirectional=True),
            "max_distance",
        ),
        (
            dict(num_buckets=8, max_distance=1, bidirectional=False),
            "max_distance",
        ),
        (dict(num_buckets=8, max_distance=0), "max_distance"),
        (dict(bidirectional="yes"), "bidirectional"),
    ],
)
def test_arguments_t5_divides_by_zero_with_are_refused(kwargs, name):
    """T5's function divides by zero (or by a negative log) here."""
    received = f"{name}={kwargs[name]!r}"
    with pytest.raises(ValueError, match=name) as error:
        scores.relative_position_bucket(np.array([-3, 0, 3]), **kwargs)
    assert received in str(error.value)
    with pytest.raises(ValueError, match=name) as error:
        scores.T5RelativeBias(**kwargs)
    assert received in str(error.value)


def test_distances_beyond_max_distance_share_the_last_bucket():
    for bidirectional in (False, True):
        got = np_(
            scores.relative_position_bucket(
                np.array([-(10**6), -129, -128, 128, 10**6]),
                bidirectional,
            )
        )
        last = 15 if bidirectional else 31
        assert got[:3].tolist() == [last] * 3
        if bidirectional:
            assert got[3:].tolist() == [31, 31]
        else:
            assert got[3:].tolist() == [0, 0]


def test_symbolic_relative_positions():
    relative = keras.KerasTensor((None, 4), "int32")
    out = scores.relative_position_bucket(relative)
    assert tuple(out.shape) == (None, 4)
