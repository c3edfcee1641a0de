"""Attention with learned sinks in float64 NumPy, for the tests of
`sink_logits` at the edges of the float range: the softmax over the
scores of the keys a row may attend to and one sink logit per head (a
virtual key with no value). A sink of `-inf` is no sink; a row with
nothing to attend to (and no finite sink) has `lse = -inf` and a zero
output; a sink of `+inf` takes all the mass (`lse = +inf`, zero output).
"""

import numpy as np


def sink_attention(
    q, k, v, mask=None, sinks=None, scale=None, return_weights=False
):
    """`q` `(b, i, h, d)`, `k` `(b, j, g, d)`, `v` `(b, j, g, e)`, `mask`
    bool broadcastable to `(b, h, i, j)` (True: may attend), `sinks`
    `(h,)` or None. Returns the output `(b, i, h, e)` and the lse `(b, h,
    i)`, float64, then the weights `(b, h, i, j)` if `return_weights`
    (the sink's share left out: rows sum to less than one)."""
    q, k, v = (np.asarray(x, "float64") for x in (q, k, v))
    h, g = q.shape[2], k.shape[2]
    k = np.repeat(k, h // g, axis=2)
    v = np.repeat(v, h // g, axis=2)
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1])
    s = np.einsum("bihd,bjhd->bhij", q, k) * scale
    if mask is not None:
        s = np.where(np.broadcast_to(mask, s.shape), s, -np.inf)
    lse = np.logaddexp.reduce(s, axis=-1)
    if sinks is not None:
        lse = np.logaddexp(lse, np.asarray(sinks, "float64")[None, :, None])
    with np.errstate(invalid="ignore"):
        p = np.exp(s - lse[..., None])
    p = np.where(np.isfinite(lse)[..., None] & np.isfinite(s), p, 0.0)
    out = np.einsum("bhij,bjhe->bihe", p, v)
    return (out, lse, p) if return_weights else (out, lse)


def band_mask(t, left, right):
    """`(1, 1, t, t)`: query `i` sees keys `i - left .. i + right`."""
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    return ((j >= i - left) & (j <= i + right))[None, None]
