"""The JAX engine of `ring_attention`: `shard_map` over the mesh,
`lax.ppermute` around the sequence axis, a `custom_vjp` whose backward
pass circulates the key/value blocks again.

Why here and not in `keras_attention/ops/_backend.py` (the home of
backend-specific code): context parallelism exists on JAX's SPMD engine
only (as `keras.distribution` does), so this whole module is JAX code,
not a backend switch around a few calls; kept private to the
distribution package, and importing JAX inside its functions only
(`import keras_attention` loads no JAX on the other backends). The
attention of each block is the package's backend-neutral
`dot_product_attention` (`_ring_blocks.py`).

One device of the sequence axis (`shard_map`'s per-device view):

    forward   n steps: attend to the block held, merge by log-sum-exp,
              pass the keys/values (and their segment ids) to the next
              device (n - 1 hops; the last step sends nothing)
    backward  n steps: recompute the block's attention and its vjp
              (from the merged output and log-sum-exp), add the block's
              dK/dV to accumulators that travel with the block; after n
              hops every accumulator is home

Memory per device: the local queries, one key/value block in flight (two
while a hop overlaps the compute), the output and log-sum-exp: O(T / n);
the residuals saved for the backward pass are the local blocks, never
the gathered keys.
"""

import functools
import math

from keras_attention.distribution import _ring_blocks as blocks


@functools.lru_cache(maxsize=None)
def _jax():
    """`(jax, lax, PartitionSpec)`, imported on first use."""
    import jax
    from jax import lax
    from jax.sharding import PartitionSpec

    return jax, lax, PartitionSpec


def to_jax_mesh(mesh):
    """A `jax.sharding.Mesh` from a `keras.distribution.DeviceMesh` or a
    `jax.sharding.Mesh`; None for anything else."""
    jax, _, _ = _jax()
    if isinstance(mesh, jax.sharding.Mesh):
        return mesh
    backend_mesh = getattr(mesh, "backend_mesh", None)
    if isinstance(backend_mesh, jax.sharding.Mesh):
        return backend_mesh
    return None


def _batch_index(lax, mesh, batch_axes):
    """This device's shard of the batch (row-major over `batch_axes`)."""
    index = 0
    for axis in batch_axes:
        index = index * mesh.shape[axis] + lax.axis_index(axis)
    return index


def _to_layout(x, layout, n):
    """`(b, T', ...)` in natural order -> the order whose contiguous
    shards are the layout's blocks (striped: token `i * n + r` to shard
    `r`, row `i`)."""
    if x is None or layout == "contiguous":
        return x
    jnp = _jax()[0].numpy
    b, t = x.shape[:2]
    x = jnp.reshape(x, (b, t // n, n) + x.shape[2:])
    return jnp.reshape(jnp.swapaxes(x, 1, 2), (b, t) + x.shape[3:])


def _from_layout(x, layout, n):
    """Inverse of `_to_layout`."""
    if layout == "contiguous":
        return x
    jnp = _jax()[0].numpy
    b, t = x.shape[:2]
    x = jnp.reshape(x, (b, n, t // n) + x.shape[2:])
    return jnp.reshape(jnp.swapaxes(x, 1, 2), (b, t) + x.shape[3:])


def _pad(x, length, value=0):
    if x is None or x.shape[1] == length:
        return x
    jnp = _jax()[0].numpy
    widths = [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2)
    return jnp.pad(x, widths, constant_values=value)


class _Ring:
    """The per-device programs of one call (forward and backward)."""

    def __init__(self, config, mesh, sequence_axis, batch_axes):
        self.config, self.mesh = config, mesh
        self.axis, self.batch_axes = sequence_axis, batch_axes
        n = config.num_blocks
        self.perm = [(i, (i + 1) % n) for i in range(n)]

    def _tables(self, lax, q, side, block, step):
        """The step's `Tables` (`side`: this device's token tables,
        `block`: the travelling block) and the index of its kind."""
        c = self.config
        r = lax.axis_index(self.axis)
        s = (r - step) % c.num_blocks
        batch0 = _batch_index(lax, self.mesh, self.batch_axes) * q.shape[0]
        tables = blocks.Tables(
            c.positions(r),
            c.positions(s),
            side.get("segment_ids"),
            block.get("segment_ids"),
            batch0,
            kv_mask=block.get("key_mask"),
        )
        return tables, c.kind_index(r, s)

    def _send(self, lax, step, tensors):
        """`tensors` passed to the next device unless `step` is the last
        (a uniform predicate: every device takes the same branch)."""
        last = step == self.config.num_blocks - 1
        return lax.cond(
            last,
            lambda xs: xs,
            lambda xs: lax.ppermute(xs, self.axis, self.perm),
            tensors,
        )

    def forward(self, q, k, v, params, side):
        """Per device: `(output (b, L, h, e) float32+, lse (b, h, L))`;
        `side`: this device's segment ids and key mask (those given)."""
        _, lax, _ = _jax()
        c = self.config
        out, lse = blocks.empty_block(q, v)
        out = out.astype(lse.dtype)

        def step(t, carry):
            block, out, lse = carry
            tables, kind = self._tables(lax, q, side, block, t)
            branches = [
                functools.partial(self._block, kind_value, tables)
                for kind_value in c.kinds()
            ]
            kv = (block["k"], block["v"])
            o_b, lse_b = lax.switch(kind, branches, q, *kv, params)
            out, lse = blocks.merge(out, lse, o_b, lse_b)
            return self._send(lax, t, block), out, lse

        carry = (_pack(k, v, side), out, lse)
        _, out, lse = lax.fori_loop(0, c.num_blocks, step, carry)
        return out, lse

    def _block(self, kind, tables, q, k, v, params):
        return blocks.attend_block(self.config, kind, q, k, v, params, tables)

    def backward(self, q, k, v, params, side, out, lse, d_out):
        """Per device: `(dq, dk, dv, dparams)`; `dparams` summed over
        every device (replicated)."""
        jax, lax, _ = _jax()
        jnp = jax.numpy
        c = self.config
        d_lse = jnp.zeros_like(lse)

        def grads(kind, tables, q, k, v, params):
            fn = functools.partial(self._block, kind, tables)
            (o_b, lse_b), pull = jax.vjp(fn, q, k, v, params)
            cot = blocks.block_cotangents(out, lse, d_out, d_lse, o_b, lse_b)
            return pull(cot)

        def step(t, carry):
            block, dq, dk, dv, dp = carry
            tables, kind = self._tables(lax, q, side, block, t)
            branches = [
                functools.partial(grads, kind_value, tables)
                for kind_value in c.kinds()
            ]
            kv = (block["k"], block["v"])
            g = lax.switch(kind, branches, q, *kv, params)
            dq = dq + g[0].astype(dq.dtype)
            dk = dk + g[1].astype(dk.dtype)
            dv = dv + g[2].astype(dv.dtype)
            dp = jax.tree.map(jnp.add, dp, g[3])
            # The accumulators travel with their block: n hops bring them
            # home; the block itself is not needed after the last step.
            dk, dv = lax.ppermute((dk, dv), self.axis, self.perm)
            return self._send(lax, t, block), dq, dk, dv, dp

        acc = jnp.float64 if q.dtype == jnp.float64 else jnp.float32
        carry = (
            _pack(k, v, side),
            jnp.zeros(q.shape, acc),
            jnp.zeros(k.shape, acc),
            jnp.zeros(v.shape, acc),
            jax.tree.map(jnp.zeros_like, params),
        )
        _, dq, dk, dv, dp = lax.fori_loop(0, c.num_blocks, step, carry)
        axes = (self.axis,) + tuple(self.batch_axes)
        dp = jax.tree.map(lambda g: lax.psum(g, axes), dp)
        return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dp


def _pack(k, v, side):
    """What travels around the ring: the key/value block and its token
    tables (segment ids, key mask: those given)."""
    return {"k": k, "v": v, **side}


def _specs(P, batch_axes, sequence_axis):
    batch = tuple(batch_axes) or None
    if batch is not None and len(batch) == 1:
        batch = batch[0]
    return P(batch, sequence_axis), P(batch, None, sequence_axis)


def ring(config, mesh, sequence_axis, batch_axes, q, k, v, params, side):
    """The ring over already padded, layout-ordered global arrays: the
    output `(b, T', h, e)` in the query's dtype; differentiable w.r.t.
    `q`, `k`, `v` and `params` (a tuple). `side`: a dict of the token
    tables given (`segment_ids`, `key_mask`; no gradient)."""
    jax, _, P = _jax()
    engine = _Ring(config, mesh, sequence_axis, batch_axes)
    tokens, rows = _specs(P, batch_axes, sequence_axis)
    params_spec = jax.tree.map(lambda _: P(), params)
    side_spec = {name: tokens for name in side}
    # No replication checks: the programs are not differentiated through
    # `shard_map` (the custom VJP below pairs them), and the loop carries
    # start as constants that the hops make per-device.
    shard = functools.partial(jax.shard_map, mesh=mesh, check_vma=False)
    forward = shard(
        engine.forward,
        in_specs=(tokens,) * 3 + (params_spec, side_spec),
        out_specs=(tokens, rows),
    )
    backward = shard(
        engine.backward,
        in_specs=(tokens,) * 3 + (params_spec, side_spec, tokens, rows, tokens),
        out_specs=(tokens, tokens, tokens, params_spec),
    )

    @jax.custom_vjp
    def attend(q, k, v, params):
        out, _ = forward(q, k, v, params, side)
        return out.astype(q.dtype)

    def attend_fwd(q, k, v, params):
        out, lse = forward(q, k, v, params, side)
        return out.astype(q.dtype), (q, k, v, params, out, lse)

    def attend_bwd(residuals, d_out):
        q, k, v, params, out, lse = residuals
        return backward(q, k, v, params, side, out, lse, d_out)

    attend.defvjp(attend_fwd, attend_bwd)
    return attend(q, k, v, params)


def ring_attention(
    query, key, value, mesh, sequence_axis, config, side, params
):
    """Pads and orders the natural-order global arrays, runs the ring,
    and restores the order: `(b, T, h, e)`. `side`: the token tables
    given (`segment_ids`, `key_mask`, `query_mask`: `(b, T)` or None)."""
    jax, _, _ = _jax()
    jnp = jax.numpy
    n, length = config.num_blocks, config.length
    padded = n * config.block_length
    batch_axes = tuple(
        a for a in mesh.axis_names if a != sequence_axis and mesh.shape[a] > 1
    )
    # Natural order, sharded along the sequence, on both sides of the
    # layout's permutation: XLA moves the tokens between devices (an
    # all-to-all) instead of gathering them, and the constraint's
    # transpose keeps the gradients w.r.t. the inputs sharded too.
    natural = functools.partial(
        _sharded, mesh, _specs(_jax()[2], batch_axes, sequence_axis)[0]
    )
    arrays = [
        natural(_pad(jnp.asarray(x), padded)) for x in (query, key, value)
    ]
    arrays = [_to_layout(x, config.layout, n) for x in arrays]
    tables = {}
    for name, dtype, fill in (
        ("segment_ids", "int32", -1),
        ("key_mask", "bool", False),
    ):
        if side.get(name) is not None:
            x = _pad(jnp.asarray(side[name]).astype(dtype), padded, fill)
            tables[name] = _to_layout(x, config.layout, n)
    out = ring(config, mesh, sequence_axis, batch_axes, *arrays, params, tables)
    out = natural(_from_layout(out, config.layout, n))[:, :length]
    query_mask = side.get("query_mask")
    if query_mask is None:
        return out
    # Padded queries give a zero result (and no gradient).
    keep = jnp.asarray(query_mask).astype(out.dtype)[:, :, None, None]
    return out * keep


def _sharded(mesh, spec, x):
    """`x` constrained to `spec` on `mesh` (`with_sharding_constraint`)."""
    jax, _, _ = _jax()
    return jax.lax.with_sharding_constraint(
        x, jax.sharding.NamedSharding(mesh, spec)
    )


def batch_shards(mesh, sequence_axis):
    """How many shards the batch is split into: the product of the
    mesh's other axes."""
    return math.prod(
        int(size) for a, size in mesh.shape.items() if a != sequence_axis
    )
