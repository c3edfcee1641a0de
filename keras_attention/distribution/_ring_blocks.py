"""One step of ring attention: a device's queries against the key/value
block it holds, on the package's own attention (`dot_product_attention`,
so every path, mask and score object applies), with global positions.

Backend-neutral (`keras.ops` only); the JAX collectives that move the
blocks around the ring are in `_jax_ring.py`.

Positions. The padded sequence of `T' = n * L` tokens (`n` devices of
the sequence axis, `L` tokens each) is split in one of two layouts:

    contiguous: device r holds the tokens r * L + i,  i = 0 .. L - 1
    striped:    device r holds the tokens i * n + r   (Brandon et al.)

A block pairs the queries of device `r` with the keys of device `s`.
Under a causal mask its shape is known from `(r, s)` alone (`kind`):

    FULL      every key visible        (not causal; contiguous s < r)
    DIAGONAL  key j visible iff j <= i (contiguous s == r; striped s <= r)
    SHIFTED   key j visible iff j < i  (striped s > r): queries 1.. against
              keys ..L-2, a causal block one row down; row 0 sees nothing
    SKIPPED   no key visible           (contiguous s > r): not computed

so the causal rule runs as the paths' own `causal=True` (tiles above the
diagonal skipped on the blockwise path), on local indices. Mask and score
objects see global positions: they are wrapped (`GlobalIndices`,
`scoring.AtPositions`) to read `q_positions[q_idx]`, `kv_positions[kv_idx]`
and the example's index in the whole batch.

Axes in comments: b - batch (this device's shard), i/j - local query/key
positions, h - query heads, e - value head dim.
"""

import contextlib
import dataclasses

import keras
from keras import ops

from keras_attention.ops import dot_product_attention
from keras_attention.ops import merge_attention
from keras_attention.ops import paths
from keras_attention.ops.log_sum_exp import lse_dtype
from keras_attention.ops.scoring import AtPositions

FULL, DIAGONAL, SHIFTED, SKIPPED = 0, 1, 2, 3
NEG_INF = float("-inf")
# The ring's name in the table of paths (`_ring_path.py`) and its options.
RING_PATH = "ring"
RING_OPTIONS = ("mesh", "sequence_axis", "layout")


@dataclasses.dataclass(frozen=True)
class RingConfig:
    """What every block of one ring attention call shares (static).

    Attributes:
        num_blocks: `n`, the devices of the sequence axis.
        block_length: `L`, tokens per device.
        length: `T`, the sequence's real length (`T <= n * L`; positions
            from `T` on are padding: masked keys, dropped queries).
        layout: "striped" or "contiguous".
        causal: whether key `j` is visible to query `i` only if `j <= i`.
        scale: the scores' scale.
        mask_mod: the user's mask function (global positions) or None.
        score_mod: the user's score function (global positions) or None.
        score_variables: the float variables of a `ScoreLayer` score
            (read through `params`, so their gradient is computed).
        segments: whether segment ids (documents) mask the blocks.
        key_masked: whether a key mask (padding) travels with the keys.
    """

    num_blocks: int
    block_length: int
    length: int
    layout: str
    causal: bool
    scale: float
    mask_mod: object = None
    score_mod: object = None
    score_variables: tuple = ()
    segments: bool = False
    key_masked: bool = False

    @property
    def padded(self):
        return self.num_blocks * self.block_length != self.length

    def kinds(self):
        """The kinds of block this call can meet, in `lax.switch` order
        (`kind_index` indexes this tuple)."""
        if not self.causal:
            return (FULL,)
        if self.layout == "striped":
            return (DIAGONAL, SHIFTED)
        return (FULL, DIAGONAL, SKIPPED)

    def kind_index(self, r, s):
        """Index into `kinds()` of the block of queries of device `r`
        against keys of device `s` (int32 scalar tensors)."""
        zero = ops.zeros((), "int32")
        if not self.causal:
            return zero
        if self.layout == "striped":
            return ops.where(s <= r, zero, zero + 1)
        return ops.where(s < r, zero, ops.where(s == r, zero + 1, zero + 2))

    def positions(self, device):
        """Global positions `(L,)` int32 of the tokens `device` holds."""
        i = ops.arange(self.block_length, dtype="int32")
        device = ops.cast(device, "int32")
        if self.layout == "striped":
            return i * self.num_blocks + device
        return device * self.block_length + i


class Tables:
    """Per-block lookup tables: global positions of the queries `(i,)`
    and keys `(j,)`, segment ids `(b, i)` / `(b, j)` (or None), the
    offset of this device's examples in the whole batch, and the keys'
    mask `(b, j)` (True on real keys; or None)."""

    def __init__(
        self, q_pos, kv_pos, q_seg=None, kv_seg=None, batch0=0, kv_mask=None
    ):
        self.q_pos, self.kv_pos = q_pos, kv_pos
        self.q_seg, self.kv_seg = q_seg, kv_seg
        self.batch0, self.kv_mask = batch0, kv_mask

    def shifted(self):
        """The tables of a SHIFTED block: queries 1.., keys ..L-2."""

        def rows(x, part):
            return None if x is None else x[:, part]

        return Tables(
            self.q_pos[1:],
            self.kv_pos[:-1],
            rows(self.q_seg, slice(1, None)),
            rows(self.kv_seg, slice(None, -1)),
            self.batch0,
            rows(self.kv_mask, slice(None, -1)),
        )


def _look_up(table, index):
    """`table[index]` along the last axis of a 1-D table, indices clipped
    (a tile's padding reads the last entry: masked anyway)."""
    index = ops.clip(ops.cast(index, "int32"), 0, ops.shape(table)[-1] - 1)
    return ops.take(table, index)


def _look_up_rows(table, batch, index):
    """`table[batch, index]` of a `(b, n)` table, indices broadcast."""
    width = ops.shape(table)[1]
    index = ops.clip(ops.cast(index, "int32"), 0, width - 1)
    flat = ops.reshape(table, (-1,))
    return ops.take(flat, ops.cast(batch, "int32") * width + index)


class GlobalIndices:
    """A mask or score function seen from a block: the local indices the
    paths give (`batch` in this device's shard, `q_idx`/`kv_idx` in the
    block) turned into the global ones (example in the whole batch,
    positions in the sequence) before `fn` sees them; and, for masks,
    the block's own rules and-ed in: same segment (documents), keys
    inside the real sequence (padding)."""

    def __init__(self, fn, tables, is_mask, key_limit=None):
        self.fn, self.tables, self.is_mask = fn, tables, is_mask
        self.key_limit = key_limit

    def _global(self, batch, q_idx, kv_idx):
        t = self.tables
        return (
            ops.cast(batch, "int32") + t.batch0,
            _look_up(t.q_pos, q_idx),
            _look_up(t.kv_pos, kv_idx),
        )

    def __call__(self, *args):
        if not self.is_mask:
            score, batch, head, q_idx, kv_idx = args
            b, q, kv = self._global(batch, q_idx, kv_idx)
            return self.fn(score, b, head, q, kv)
        batch, head, q_idx, kv_idx = args
        t = self.tables
        mask = None
        if self.fn is not None:
            b, q, kv = self._global(batch, q_idx, kv_idx)
            mask = ops.cast(self.fn(b, head, q, kv), "bool")
        if t.q_seg is not None:
            same = _look_up_rows(t.q_seg, batch, q_idx) == _look_up_rows(
                t.kv_seg, batch, kv_idx
            )
            mask = same if mask is None else ops.logical_and(mask, same)
        if t.kv_mask is not None:
            real = ops.cast(_look_up_rows(t.kv_mask, batch, kv_idx), "bool")
            mask = real if mask is None else ops.logical_and(mask, real)
        if self.key_limit is not None:
            real = _look_up(t.kv_pos, kv_idx) < self.key_limit
            mask = real if mask is None else ops.logical_and(mask, real)
        return mask


def _score_function(config, tables):
    score_mod = config.score_mod
    if score_mod is None:
        return None
    if config.score_variables:
        # A `ScoreLayer` with weights: `AtPositions` keeps it visible to
        # the paths (its weights are passed explicitly to the blockwise
        # backward pass); its `batch` index is this device's.
        return AtPositions(score_mod, tables.q_pos, tables.kv_pos)
    return GlobalIndices(score_mod, tables, is_mask=False)


def _mask_function(config, tables, causal):
    # Padded keys: masked by the causal rule for every real query
    # (positions >= T follow them all); otherwise by position.
    limit = config.length if config.padded and not causal else None
    tables_mask = config.segments or config.key_masked
    if config.mask_mod is None and not tables_mask and limit is None:
        return None
    return GlobalIndices(config.mask_mod, tables, True, key_limit=limit)


def _block_scope():
    """Inside the "ring" path's scope, the blocks take the automatic
    choice (with the scope's other options: tile sizes); any other
    scope stays as it is."""
    scope = paths.current_scope()
    if scope.name != RING_PATH:
        return contextlib.nullcontext()
    options = {k: v for k, v in scope.options.items() if k not in RING_OPTIONS}
    return paths.release_exclusive_scope(**options)


def _attend(config, q, k, v, params, tables, causal):
    with _block_scope():
        return _attend_block(config, q, k, v, params, tables, causal)


def _attend_block(config, q, k, v, params, tables, causal):
    kwargs = dict(
        scale=config.scale,
        causal=causal,
        mask_mod=_mask_function(config, tables, causal),
        score_mod=_score_function(config, tables),
        return_lse=True,
    )
    if not config.score_variables:
        return dot_product_attention(q, k, v, **kwargs)
    mapping = list(zip(config.score_variables, params))
    with keras.StatelessScope(state_mapping=mapping):
        return dot_product_attention(q, k, v, **kwargs)


def empty_block(q, v):
    """The result of a block that sees no key: zeros, `lse = -inf`."""
    b, i, h = ops.shape(q)[0], ops.shape(q)[1], q.shape[2]
    out = ops.zeros((b, i, h, v.shape[-1]), q.dtype)
    lse = ops.full((b, h, i), NEG_INF, lse_dtype(q.dtype))
    return out, lse


def attend_block(config, kind, q, k, v, params, tables):
    """`(output (b, i, h, e), lse (b, h, i))` of queries `q` against one
    key/value block, for a block of `kind` (a static int)."""
    if kind == SKIPPED:
        return empty_block(q, v)
    if kind != SHIFTED:
        return _attend(config, q, k, v, params, tables, kind == DIAGONAL)
    out, lse = _attend(
        config,
        q[:, 1:],
        k[:, :-1],
        v[:, :-1],
        params,
        tables.shifted(),
        True,
    )
    first_out, first_lse = empty_block(q[:, :1], v)
    return (
        ops.concatenate([first_out, out], axis=1),
        ops.concatenate([first_lse, lse], axis=2),
    )


def merge(acc_out, acc_lse, out, lse):
    """The running result of the blocks seen so far and one more block,
    merged by log-sum-exp (`merge_attention`); the running output is
    kept in the log-sum-exp's dtype (float32 at least)."""
    out = ops.cast(out, acc_out.dtype)
    return merge_attention([acc_out, out], [acc_lse, lse])


def block_cotangents(out, lse, d_out, d_lse, block_out, block_lse):
    """The cotangents of one block's `(output, lse)` from those of the
    merged result.

    With `w_p = exp(lse_p - lse)`, `O = sum_p w_p O_p` and `lse = log
    sum_p exp(lse_p)`:

        dO_p   = w_p dO
        dlse_p = w_p (dO . O_p - dO . O + dlse)

    (`.` over the value dim). Rows that see nothing in the block (`lse_p
    = -inf`) or at all (`lse = -inf`) get zeros.
    """
    dtype = lse.dtype
    seen = block_lse > NEG_INF
    total = ops.where(lse > NEG_INF, lse, ops.zeros_like(lse))
    gap = ops.where(seen, block_lse - total, ops.zeros_like(lse))
    w = ops.where(seen, ops.exp(gap), ops.zeros_like(lse))  # b, h, i
    d_out = ops.cast(d_out, dtype)
    w_rows = ops.transpose(w, (0, 2, 1))  # b, i, h
    d_block_out = ops.cast(d_out * w_rows[..., None], block_out.dtype)
    dot_block = ops.sum(d_out * ops.cast(block_out, dtype), axis=-1)
    dot_all = ops.sum(d_out * ops.cast(out, dtype), axis=-1)
    d_block_lse = w * (ops.transpose(dot_block - dot_all, (0, 2, 1)) + d_lse)
    return d_block_out, d_block_lse
