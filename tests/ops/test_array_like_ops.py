"""Every public op of `keras_attention.ops` that takes tensors takes
array-likes (nested Python lists) too, as Keras's ops do, and gives what
the same call with NumPy arrays gives (issue 53, defect 7: the layers'
half is `tests/layers/test_array_like_arguments.py`)."""

import keras
import numpy as np
import pytest

import keras_attention as ka

RNG = np.random.default_rng(7)
B, T, H, D = 2, 5, 2, 4
Q, K, V = (RNG.normal(size=(B, T, H, D)).astype("float32") for _ in "qkv")
MASK = np.array([[True] * T, [True, True, True, False, False]])
GLOBAL = np.zeros((B, T), bool)
GLOBAL[:, 0] = True
SCORES = RNG.normal(size=(B, T, T)).astype("float32")


def _lse_parts():
    return ka.ops.dot_product_attention(Q, K, V, return_lse=True)


# name -> (op, positional arrays, keyword arrays, fixed keyword arguments):
# every array (positional or keyword) is passed once as it is and once as
# nested lists.
CASES = {
    "dot_product_attention": (
        ka.ops.dot_product_attention,
        (Q, K, V),
        {"query_mask": MASK, "key_mask": MASK, "sink_logits": np.ones(H)},
        {"causal": True},
    ),
    "local_attention": (
        ka.ops.local_attention,
        (Q, K, V),
        {"query_mask": MASK, "key_mask": MASK, "sink_logits": np.ones(H)},
        {"window_size": 2},
    ),
    "global_local_attention": (
        ka.ops.global_local_attention,
        (Q, K, V),
        {"global_mask": GLOBAL, "key_mask": MASK, "query_mask": MASK},
        {"window_size": 1},
    ),
    "linear_attention": (
        ka.ops.linear_attention,
        (Q, K, V),
        {"key_mask": MASK, "segment_ids": np.array([[0, 0, 1, 1, 1]] * B)},
        {},
    ),
    "gated_delta_rule": (
        ka.ops.gated_delta_rule,
        (Q, K, V),
        {
            "g": np.full((B, T, H), -0.1),
            "beta": np.full((B, T, H), 0.5),
            "key_mask": MASK,
        },
        {},
    ),
    "masked_softmax": (
        ka.ops.masked_softmax,
        (SCORES,),
        {"mask": np.broadcast_to(MASK[:, None, :], (B, T, T))},
        {},
    ),
    "segment_softmax": (
        ka.ops.segment_softmax,
        (np.arange(6, dtype="float32"), np.array([0, 0, 1, 1, 2, 2])),
        {"mask": np.array([True, True, False, True, True, True])},
        {"num_segments": 3},
    ),
    "banded_to_dense": (
        ka.ops.banded_to_dense,
        (RNG.random((B, H, T, 3)).astype("float32"),),
        {},
        {"window_size": 1},
    ),
    "dense_to_banded": (
        ka.ops.dense_to_banded,
        (RNG.random((B, H, T, T)).astype("float32"),),
        {},
        {"window_size": 1},
    ),
    "additive_scores": (
        ka.ops.additive_scores,
        (Q[:, :, 0], K[:, :, 0], np.ones(D, "float32")),
        {},
        {},
    ),
    "broadcast_add": (
        ka.ops.broadcast_add,
        (np.ones((B, T, H, 1), "float32"), np.arange(H * 1.0)[:, None]),
        {},
        {},
    ),
    "topk_attention": (
        ka.ops.topk_attention,
        (Q, K, V, np.array([[[0, 1], [0, 1], [1, 2], [2, 3], [3, 4]]] * B)),
        {"query_mask": MASK, "key_mask": MASK},
        {"causal": True},
    ),
    "merge_attention": (
        lambda outputs, lses: ka.ops.merge_attention([outputs], [lses]),
        tuple(np.asarray(p) for p in _lse_parts()),
        {},
        {},
    ),
}


def _numpy(result):
    return [keras.ops.convert_to_numpy(x) for x in keras.tree.flatten(result)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_lists_equal_arrays(name):
    op, args, array_kwargs, kwargs = CASES[name]
    expected = _numpy(op(*args, **array_kwargs, **kwargs))
    listed = op(
        *(a.tolist() for a in args),
        **{k: v.tolist() for k, v in array_kwargs.items()},
        **kwargs,
    )
    got = _numpy(listed)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)


def test_every_public_tensor_op_has_a_case():
    """An op added to `keras_attention.ops.__all__` needs a case here, or
    a reason in `NOT_TENSOR_OPS`."""
    covered = set(CASES) | set(NOT_TENSOR_OPS)
    assert sorted(set(ka.ops.__all__) - covered) == []


# Public names that take no array arguments of their own (or are covered
# elsewhere), with why.
NOT_TENSOR_OPS = {
    "assign_slice": "writes into a variable and returns nothing; its list "
    "value is tested in tests/ops/test_assign_slice.py",
    "compile_step": "a decorator",
    "compiled_kernel": "a decorator",
    "implementation_scope": "a context manager",
    "is_symbolic": "a predicate over any value",
    "mask_fill_value": "takes a dtype",
    "effective_window": "takes integers",
    "scan_carry": "a loop helper over tensors of the caller's",
    "global_local_weights_to_dense": "takes the dict that "
    "global_local_attention returns",
    "zeros_for_initializers": "a context manager",
}


def test_a_ragged_list_is_refused_naming_the_argument():
    with pytest.raises(ValueError, match="query"):
        ka.ops.dot_product_attention([[1.0], [1.0, 2.0]], K, V)
