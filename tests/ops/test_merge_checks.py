"""`merge_attention` checks its parts against each other: outputs `(b, i,
h, e)` of one shape, lses `(b, h, i)` matching them, `sink_logits` `(h,)`;
a mismatch is refused naming the argument and its shape, never
broadcast; parts given as Python lists are accepted.
"""

import re

import numpy as np
import pytest
from keras import ops

import keras_attention as ka

B, T, H, E = 2, 5, 4, 3
RNG = np.random.default_rng(3)
OUT = RNG.normal(size=(B, T, H, E)).astype("float32")
LSE = RNG.normal(size=(B, H, T)).astype("float32")
SINKS = RNG.normal(size=(H,)).astype("float32")


def merge(outputs=None, lses=None, **kwargs):
    outputs = [OUT, OUT + 1.0] if outputs is None else outputs
    lses = [LSE, LSE - 1.0] if lses is None else lses
    return ka.ops.merge_attention(outputs, lses, **kwargs)


@pytest.mark.parametrize(
    "sinks,shape",
    [
        (SINKS[:1], "(1,)"),  # Once broadcast to every head.
        (SINKS[:3], "(3,)"),
        (np.zeros((1, H), "float32"), "(1, 4)"),
        (np.float32(0.5), "()"),
    ],
)
def test_sink_logits_of_another_shape_are_refused(sinks, shape):
    with pytest.raises(
        ValueError, match=re.escape(f"sink_logits.shape={shape}")
    ):
        merge(sink_logits=sinks)


def test_parts_of_another_batch_are_refused():
    with pytest.raises(ValueError, match=r"outputs\[1\].*\(1, 5, 4, 3\)"):
        merge([OUT, OUT[:1]], [LSE, LSE[:1]])
    with pytest.raises(ValueError, match=r"lses\[1\].*\(1, 4, 5\)"):
        merge(lses=[LSE, LSE[:1]])


@pytest.mark.parametrize(
    "lse,shape",
    [
        (LSE[..., None], r"\(2, 4, 5, 1\)"),  # An extra axis.
        (np.transpose(LSE, (0, 2, 1)), r"\(2, 5, 4\)"),  # (b, i, h).
        (LSE[:, :2], r"\(2, 2, 5\)"),  # Fewer heads.
        (LSE[0], r"\(4, 5\)"),  # No batch axis.
    ],
)
def test_lses_that_do_not_match_the_outputs_are_refused(lse, shape):
    with pytest.raises(ValueError, match=rf"lses\[1\]\.shape={shape}"):
        merge(lses=[LSE, lse])
    with pytest.raises(ValueError, match=rf"lses\[0\]\.shape={shape}"):
        merge(lses=[lse, LSE])


@pytest.mark.parametrize(
    "out,shape",
    [
        (OUT[..., 0], r"\(2, 5, 4\)"),
        (OUT[:, :3], r"\(2, 3, 4, 3\)"),
        (OUT[..., :2], r"\(2, 5, 4, 2\)"),
    ],
)
def test_outputs_of_another_shape_are_refused(out, shape):
    with pytest.raises(ValueError, match=rf"outputs\[1\]\.shape={shape}"):
        merge(outputs=[OUT, out])


def test_outputs_and_lses_must_be_lists():
    with pytest.raises(TypeError, match="outputs"):
        ka.ops.merge_attention(OUT, [LSE])
    with pytest.raises(TypeError, match="lses"):
        ka.ops.merge_attention([OUT], LSE)


def test_python_lists_are_accepted():
    out, lse = merge(
        [OUT.tolist(), (OUT + 1.0).tolist()],
        [LSE.tolist(), (LSE - 1.0).tolist()],
        sink_logits=SINKS.tolist(),
    )
    want_out, want_lse = merge(sink_logits=SINKS)
    np.testing.assert_allclose(ops.convert_to_numpy(out), want_out, atol=1e-6)
    np.testing.assert_allclose(ops.convert_to_numpy(lse), want_lse, atol=1e-6)
    # And equal to the merge written in NumPy.
    lses = np.stack([LSE, LSE - 1.0]).astype("float64")
    total = np.logaddexp.reduce(lses, axis=0)
    weights = np.exp(lses - total)  # (p, b, h, i)
    outs = np.stack([OUT, OUT + 1.0])
    merged = np.einsum("pbhi,pbihe->bihe", weights, outs)
    with_sinks = np.logaddexp(total, SINKS[None, :, None])
    keep = np.exp(total - with_sinks).transpose(0, 2, 1)[..., None]
    np.testing.assert_allclose(
        ops.convert_to_numpy(out), merged * keep, atol=1e-5
    )
    np.testing.assert_allclose(ops.convert_to_numpy(lse), with_sinks, atol=1e-5)
