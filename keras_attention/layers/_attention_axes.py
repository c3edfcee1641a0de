"""The `attention_axes` layout of `MultiHeadAttention` (inputs of rank
above 3): the other axes merged into the batch, the attention axes into one
sequence axis, attention on rank-3 tensors, and back.

`AttentionAxesLayout` is a mixin of `MultiHeadAttention` (it reads
`self.attention_axes`, `self.num_heads`, `self._output_shapes` and calls
`self._call_3d`); kept apart so that the layer's own module holds the
projections, the cache and the attention step only. It also gives the
layer's `describe_attention` (the recording hook), whose weights it puts
back in `(batch, heads, Tq, Tk)`.
"""

import numpy as np
from keras import ops

from keras_attention.layers import recording
from keras_attention.utils import validation


def prod(dims):
    """Product of dimensions (ints, or scalar tensors when not static)."""
    out = 1
    for d in dims:
        out = out * d
    return out


def static_prod(dims):
    """Product of static dimensions, None if one of them is unknown."""
    return None if None in dims else prod(dims)


def check_attention_axes(attention_axes):
    if attention_axes is None:
        return None
    if validation.is_int(attention_axes):
        axes = (attention_axes,)
    else:
        axes = attention_axes
    if (
        not isinstance(axes, (tuple, list))
        or not axes
        or not all(validation.is_int(a) for a in axes)
    ):
        raise ValueError(
            "`attention_axes` must be None, an int, or a non-empty list or "
            f"tuple of ints. Received: attention_axes={attention_axes!r}"
        )
    return tuple(int(a) for a in axes)


class AttentionAxesLayout:
    """Mixin: `attention_axes` for inputs of rank > 3 (see the module)."""

    def _layout(self, rank):
        """`(axes, other_axes, perm)` for inputs of rank `rank`.

        `perm` brings an input to `(batch, <other axes>, <attention axes>,
        features)`; the layer then merges the first group into the batch and
        the second into one sequence axis.
        """
        if self.attention_axes is None:
            axes = tuple(range(1, rank - 1))
        else:
            axes = tuple(a + rank if a < 0 else a for a in self.attention_axes)
            bad = [a for a in axes if not 1 <= a <= rank - 2]
            if bad or len(set(axes)) != len(axes):
                raise ValueError(
                    "`attention_axes` must be distinct axes of the inputs "
                    "other than the batch (0) and features (-1) axes. "
                    f"Received: attention_axes={self.attention_axes!r} for "
                    f"inputs of rank {rank}"
                )
        others = tuple(i for i in range(1, rank - 1) if i not in axes)
        return axes, others, (0,) + others + axes + (rank - 1,)

    def _flat_shape(self, shape):
        """Static rank-3 shape of an input after merging axes."""
        shape = tuple(shape)
        if len(shape) == 3:
            return shape
        axes, others, _ = self._layout(len(shape))
        lead = [shape[0]] + [shape[a] for a in others]
        return (
            static_prod(lead),
            static_prod([shape[a] for a in axes]),
            shape[-1],
        )

    def _flatten(self, x, layout, keep_last=True):
        """`(b, <axes>, [f])` -> `(b * others, T, [f])` following `layout`."""
        _, others, perm = layout
        if not keep_last:
            perm = perm[:-1]
        x = ops.transpose(x, perm)
        shape = ops.shape(x)
        lead = prod(shape[: 1 + len(others)])
        stop = len(shape) - 1 if keep_last else len(shape)
        length = prod(shape[1 + len(others) : stop])
        new = (lead, length) + ((x.shape[-1],) if keep_last else ())
        return ops.reshape(x, new)

    def _flatten_attention_mask(self, mask, query, key, layout):
        """Keras's high-rank `attention_mask` -> `(b', [h,] Tq, Tk)`.

        As in Keras, the mask's last axes are the query then key attention
        axes, and its leading axes a prefix of `(batch, <other axes>,
        num_heads)` (missing ones broadcast).
        """
        axes, others, _ = layout
        q_shape, k_shape = ops.shape(query), ops.shape(key)
        qa = tuple(q_shape[a] for a in axes)
        ka = tuple(k_shape[a] for a in axes)
        full_lead = (q_shape[0],) + tuple(q_shape[a] for a in others)
        full_lead += (self.num_heads,)
        n_lead = len(mask.shape) - 2 * len(axes)
        if not 0 <= n_lead <= len(full_lead):
            raise ValueError(
                "`attention_mask` must end with the query and key attention "
                f"axes ({2 * len(axes)} axes), preceded by at most the batch, "
                "the other axes and the heads. Received: "
                f"attention_mask.shape={tuple(mask.shape)!r}, "
                f"query.shape={tuple(query.shape)!r}, attention_axes={axes!r}"
            )
        mask = ops.broadcast_to(
            ops.cast(mask, "bool"), full_lead[:n_lead] + qa + ka
        )
        tq, tk = prod(qa), prod(ka)
        if n_lead == 0:
            return ops.reshape(mask, (tq, tk))
        if n_lead == len(full_lead):  # With the heads axis.
            lead = prod(full_lead[:-1])
            return ops.reshape(mask, (lead, self.num_heads, tq, tk))
        present = prod(full_lead[:n_lead])
        absent = prod(full_lead[n_lead:-1])
        mask = ops.reshape(mask, (present, 1, tq, tk))
        mask = ops.broadcast_to(mask, (present, absent, tq, tk))
        return ops.reshape(mask, (present * absent, tq, tk))

    def _call_high_rank(self, call):
        """`attention_axes`: merge the other axes into the batch and the
        attention axes into one sequence axis, attend (rank 3), undo.
        `call`: the layer's `AttentionCall` (no cache: refused before)."""
        query, key = call.query, call.key
        return_attention_scores = call.return_attention_scores
        layout = self._layout(len(query.shape))
        axes, others, perm = layout

        def flat(mask):
            if mask is None:
                return None
            mask = ops.cast(mask, "bool")
            return self._flatten(mask, layout, keep_last=False)

        attention_mask = call.attention_mask
        if attention_mask is not None:
            attention_mask = self._flatten_attention_mask(
                attention_mask, query, key, layout
            )
        flat_call = call.replace(
            query=self._flatten(query, layout),
            value=self._flatten(call.value, layout),
            key=self._flatten(key, layout),
            query_mask=flat(call.query_mask),
            value_mask=flat(call.value_mask),
            key_mask=flat(call.key_mask),
            attention_mask=attention_mask,
            mod_inputs=None,
        )
        result = self._call_3d(flat_call)
        output, scores = result if return_attention_scores else (result, None)
        q_shape, k_shape = ops.shape(query), ops.shape(key)
        out_dims = self._output_shapes or (query.shape[-1],)
        # (b, <others>, <attention axes>, <output dims>), then the query's
        # axis order back.
        output = ops.reshape(
            output, tuple(q_shape[p] for p in perm[:-1]) + tuple(out_dims)
        )
        n = len(perm) - 1
        inverse = [perm[:-1].index(i) for i in range(n)]
        inverse += list(range(n, n + len(out_dims)))
        output = ops.transpose(output, inverse)
        if not return_attention_scores:
            return output
        # Keras's layout: (b, <others>, heads, <query axes>, <key axes>).
        scores = ops.reshape(
            scores,
            (q_shape[0],)
            + tuple(q_shape[a] for a in others)
            + (self.num_heads,)
            + tuple(q_shape[a] for a in axes)
            + tuple(k_shape[a] for a in axes),
        )
        return output, scores

    def weights_as_4d(self, weights, query_rank):
        """Attention weights of this layout `(b, <others>, heads, <q axes>,
        <k axes>)` (NumPy) -> `(b * others, heads, Tq, Tk)` (rank 4
        unchanged).

        The heads axis follows from the query's rank and `attention_axes`
        (`1 + len(others)`), never from matching sizes: another axis may
        have `num_heads` steps too.
        """
        if weights.ndim == 4:
            return weights
        shape = weights.shape
        if self.attention_axes is None:
            axes = query_rank - 2
        elif isinstance(self.attention_axes, int):
            axes = 1
        else:
            axes = len(self.attention_axes)
        heads_axis = 1 + (query_rank - 2 - axes)
        lead = int(np.prod(shape[:heads_axis]))
        tq = int(np.prod(shape[heads_axis + 1 : heads_axis + 1 + axes]))
        return weights.reshape(lead, self.num_heads, tq, -1)

    def describe_attention(self, arguments, scores, options):
        """`collect_attention`'s hook (`layers/recording.py`): the
        weights of one call as `(batch, heads, Tq, Tk)` and what they
        are (self- or cross-attention, padding masks, causal)."""
        query, value = arguments.get("query"), arguments.get("value")
        key = arguments.get("key")
        weights = self.weights_as_4d(
            recording.numpy_weights(scores), len(query.shape)
        )
        is_self = value is query and (key is None or key is query)
        meta = dict(
            kind="self" if is_self else "cross",
            query_mask=recording.padding_mask(
                arguments.get("query_mask"), query
            ),
            key_mask=recording.all_masks(
                recording.padding_mask(arguments.get("value_mask"), value),
                recording.padding_mask(arguments.get("key_mask"), key),
            ),
            causal=bool(arguments.get("use_causal_mask")),
            window=None,
        )
        if weights.shape[0] != query.shape[0]:  # attention_axes
            meta["query_mask"] = meta["key_mask"] = None
        return weights, meta
