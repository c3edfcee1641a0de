"""`ring_attention`: exact attention over a sequence sharded across the
devices of a mesh axis (context parallelism), on the JAX backend."""

import math

import keras
from keras import ops

from keras_attention.distribution import _jax_ring
from keras_attention.distribution import _ring_blocks
from keras_attention.ops import captured
from keras_attention.ops import scoring
from keras_attention.utils import validation

LAYOUTS = ("striped", "contiguous")


def ring_attention(
    query,
    key,
    value,
    mesh,
    sequence_axis="sequence",
    causal=False,
    mask_mod=None,
    score_mod=None,
    segment_ids=None,
    layout="striped",
    *,
    scale=None,
    query_mask=None,
    key_mask=None,
):
    """Attention with the sequence sharded over a mesh axis: ring attention.

    Each of the `n` devices of `mesh`'s `sequence_axis` keeps its block of
    `L = T / n` queries; the key/value blocks travel around the ring
    (`jax.lax.ppermute` inside `jax.shard_map`), one hop per step, while
    each device attends to the block it holds; the `n` partial results
    merge exactly by log-sum-exp (`keras_attention.ops.merge_attention`):

        lse = log sum_s exp(lse_s),   O = sum_s exp(lse_s - lse) O_s.

    The backward pass circulates the blocks again (with their dK/dV
    accumulators) and recomputes each block's attention: no device ever
    holds the whole key/value sequence, memory per device O(T / n). Each
    block runs on the package's `dot_product_attention` (its automatic
    path choice, `implementation_scope` applies), so the result equals
    one-device attention up to float rounding, with every mask and score
    object.

    Layouts (how the sequence is split; inputs and output are always in
    natural order, the function reorders them):
    - "striped" (Brandon et al. 2023): token `t` on device `t mod n`. Under
      a causal mask every block is about half visible, so every device
      does the same work (balanced);
    - "contiguous" (Liu et al. 2023): tokens `r L .. (r + 1) L - 1` on
      device `r`. Causal: device `r` computes `r + 1` blocks (fully masked
      ones are skipped, the ring's hops still happen): the last device
      works `n` times as long as the first.

    The batch axis is sharded over the mesh's other axes (data
    parallelism: a `(data, sequence)` mesh), heads are not sharded.
    A length `T` that `n` does not divide is padded to the next multiple
    (padded keys are masked, padded queries dropped): the result is still
    exact. Inputs on one device or already sharded are both fine (XLA
    moves them: a striped layout costs one all-to-all of the inputs and
    one of the output per call).

    Args:
        query: `(b, T, h, d)`.
        key: `(b, T, g, d)`, `h % g == 0` (grouped-query attention).
        value: `(b, T, g, e)`.
        mesh: a `keras.distribution.DeviceMesh` or a `jax.sharding.Mesh`.
        sequence_axis: the name of the mesh axis the sequence is split
            over.
        causal: key `j` visible to query `i` only if `j <= i`.
        mask_mod: optional `mask(batch, head, q_idx, kv_idx) -> bool`
            (a `keras_attention.mods` mask or a function), and-ed with the
            rest; it sees global positions and the example's index in the
            whole batch.
        score_mod: optional `score(score, batch, head, q_idx, kv_idx)`
            (`keras_attention.scores.ALiBi`, `T5RelativeBias`, `SoftCap`
            or a function), on global positions; the weights of a
            `ScoreLayer` get their gradient. (A `ScoreLayer` with weights
            sees the `batch` index within the device's batch shard.)
        segment_ids: optional int `(b, T)`: packed documents; a query
            attends only to keys of its own segment (documents may cross
            device boundaries: the ids travel with the keys).
        layout: "striped" or "contiguous".
        scale: float; defaults to `1 / sqrt(d)`.
        query_mask: optional bool `(b, T)`, True on real queries: padded
            queries get a zero result.
        key_mask: optional bool `(b, T)`, True on real keys (it travels
            with the keys).

    Returns:
        `(b, T, h, e)` in the query's dtype, natural order.

    Raises:
        NotImplementedError: on a backend other than JAX.
        ValueError / TypeError: for bad arguments (named).

    Example (on one device the ring is one block: plain attention):

    >>> import keras
    >>> import numpy as np
    >>> import keras_attention as ka
    >>> x = np.random.default_rng(0).normal(size=(1, 6, 2, 4))
    >>> x = x.astype("float32")
    >>> if keras.backend.backend() == "jax":
    ...     mesh = keras.distribution.DeviceMesh(
    ...         (1,), ["sequence"], keras.distribution.list_devices()[:1])
    ...     out = ka.distribution.ring_attention(x, x, x, mesh, causal=True)
    ... else:
    ...     out = ka.ops.dot_product_attention(x, x, x, causal=True)
    >>> ref = ka.ops.dot_product_attention(x, x, x, causal=True)
    >>> bool(np.allclose(out, ref, atol=1e-6))
    True

    References:
        - Liu, Zaharia and Abbeel, 2023, "Ring Attention with Blockwise
          Transformers for Near-Infinite Context".
        - Brandon et al., 2023, "Striped Attention: Faster Ring Attention
          for Causal Transformers".
    """
    backend = keras.backend.backend()
    if backend != "jax":
        raise NotImplementedError(
            "`ring_attention` runs on the JAX backend only (it shards the "
            "sequence with JAX's `shard_map` and `ppermute`; "
            "`keras.distribution` is JAX-only too). The current backend "
            f"is {backend!r}: set KERAS_BACKEND=jax, or use "
            "`keras_attention.ops.dot_product_attention` on one device."
        )
    jax_mesh = _jax_ring.to_jax_mesh(mesh)
    if jax_mesh is None:
        raise TypeError(
            "`mesh` must be a `keras.distribution.DeviceMesh` or a "
            f"`jax.sharding.Mesh`. Received: mesh={mesh!r}"
        )
    side = {
        "segment_ids": segment_ids,
        "key_mask": key_mask,
        "query_mask": query_mask,
    }
    _check(query, key, value, jax_mesh, sequence_axis, layout, side)
    causal = validation.check_bool("causal", causal)
    scoring.check_mod(mask_mod, "mask_mod")
    scoring.check_mod(score_mod, "score_mod")
    if captured.closes_over_tensors(score_mod):
        raise ValueError(
            "`score_mod` reads trainable variables it is not given: their "
            "gradient could not cross the ring's hand-written backward "
            "pass. Make it a `keras_attention.mods.ScoreLayer`. Received: "
            f"score_mod={score_mod!r}"
        )
    scoring.build_score_layer(score_mod, query.shape[2], "score_mod")
    variables = _score_variables(score_mod)
    n = int(jax_mesh.shape[sequence_axis])
    length = int(query.shape[1])
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    config = _ring_blocks.RingConfig(
        num_blocks=n,
        block_length=-(-length // n),
        length=length,
        layout=layout,
        causal=causal,
        scale=float(scale),
        mask_mod=mask_mod,
        score_mod=score_mod,
        score_variables=variables,
        segments=segment_ids is not None,
        key_masked=key_mask is not None,
    )
    params = tuple(ops.convert_to_tensor(v) for v in variables)
    return _jax_ring.ring_attention(
        query, key, value, jax_mesh, sequence_axis, config, side, params
    )


def _score_variables(score_mod):
    """The float variables of a `ScoreLayer` (their gradient is
    computed); a plain function has none."""
    if not isinstance(score_mod, keras.layers.Layer):
        return ()
    return tuple(
        v
        for v in score_mod.variables
        if keras.backend.is_float_dtype(
            keras.backend.standardize_dtype(v.dtype)
        )
    )


def _check(query, key, value, mesh, sequence_axis, layout, side):
    if layout not in LAYOUTS:
        raise ValueError(
            f"`layout` must be one of {LAYOUTS}. Received: layout={layout!r}"
        )
    if sequence_axis not in mesh.axis_names:
        raise ValueError(
            f"`sequence_axis` must name an axis of the mesh "
            f"{tuple(mesh.axis_names)!r}. Received: "
            f"sequence_axis={sequence_axis!r}"
        )
    shapes = {
        "query": tuple(query.shape),
        "key": tuple(key.shape),
        "value": tuple(value.shape),
    }
    for name, shape in shapes.items():
        if len(shape) != 4 or None in shape:
            raise ValueError(
                f"`{name}` must have a static shape (batch, T, heads, "
                f"dim). Received: {name}.shape={shape!r}"
            )
    q, k, v = shapes.values()
    if not (q[:2] == k[:2] == v[:2] and k[2] == v[2] and q[3] == k[3]):
        raise ValueError(
            "`query`, `key` and `value` must share (batch, T) (ring "
            "attention is self-attention over one sharded sequence), `key` "
            "and `value` their heads, `query` and `key` their dim. "
            f"Received: query.shape={q!r}, key.shape={k!r}, "
            f"value.shape={v!r}"
        )
    if q[2] % k[2]:
        raise ValueError(
            "The query heads must be a multiple of the key/value heads. "
            f"Received: query.shape={q!r}, key.shape={k!r}"
        )
    shards = _jax_ring.batch_shards(mesh, sequence_axis)
    if q[0] % shards:
        raise ValueError(
            f"The batch ({q[0]}) must be divisible by the product of the "
            f"mesh's axes other than {sequence_axis!r} ({shards}): the "
            f"batch is sharded over them. Received: query.shape={q!r}, "
            f"mesh={dict(mesh.shape)!r}"
        )
    for name, table in side.items():
        if table is None:
            continue
        shape = tuple(ops.shape(table))
        if shape != q[:2]:
            raise ValueError(
                f"`{name}` must have shape (batch, T) = {q[:2]!r}. "
                f"Received: {name}.shape={shape!r}"
            )
