"""One call of `MultiHeadAttention`, as a record.

`MultiHeadAttention.call` checks its arguments once and gathers them in an
`AttentionCall`; the rank-3 core (`_call_3d`), the `attention_axes` layout
(`_attention_axes.py`) and the rolling cache (`_rolling_attention.py`)
read it instead of passing a dozen arguments down by position. The names
are those of `call`'s arguments, so a field means what the layer's
docstring says; a step that changes one (flattened inputs, a cache's
masks) makes a new record with `replace`.
"""

import dataclasses

from keras_attention.utils import attention_checks

# The fields a caller may give as array-likes (Python lists), as Keras's
# own layer takes its masks: `AttentionCall` makes them tensors.
ARRAY_LIKE_FIELDS = (
    "query_mask",
    "value_mask",
    "key_mask",
    "attention_mask",
    "segment_ids",
    "positions",
)


@dataclasses.dataclass(frozen=True)
class AttentionCall:
    """The arguments of one `MultiHeadAttention` call (see its docstring).

    `key` is never None here: `call` sets it to `value` when it was not
    given. `value` and `key` are None only with a precomputed cache.
    """

    query: object
    value: object
    key: object
    query_mask: object = None
    value_mask: object = None
    key_mask: object = None
    attention_mask: object = None
    return_attention_scores: bool = False
    training: object = None
    use_causal_mask: bool = False
    cache: object = None
    cache_update_index: object = None
    mod_inputs: object = None
    step_inputs: object = None
    segment_ids: object = None
    cache_sink_tokens: object = None
    positions: object = None

    def __post_init__(self):
        for name in ARRAY_LIKE_FIELDS:
            value = getattr(self, name)
            object.__setattr__(
                self, name, attention_checks.as_tensor(name, value)
            )

    def replace(self, **changes):
        """A copy with `changes` (field name -> new value)."""
        return dataclasses.replace(self, **changes)

    @property
    def offset(self):
        """The position of the first query: `cache_update_index`, or 0."""
        if self.cache_update_index is None:
            return 0
        return self.cache_update_index
