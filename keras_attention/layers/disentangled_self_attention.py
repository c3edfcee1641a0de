import math

import keras
from keras import ops

from keras_attention.layers.self_attention import SelfAttention
from keras_attention.scores.disentangled import DisentangledRelativeBias
from keras_attention.utils import validation


@keras.saving.register_keras_serializable(package="keras_attention")
class DisentangledSelfAttention(SelfAttention):
    """DeBERTa's disentangled self-attention: `SelfAttention` whose scores
    add the content-to-position and position-to-content terms of a
    `scores.DisentangledRelativeBias`.

    Per call the layer projects the bias's relative embedding table with
    its own query and key projections (DeBERTa-v3's shared attention key:
    `position_query`, scaled as the queries are, and `position_key`) and
    binds them with its projected query and key heads, so that the scores
    are `(q_i . k_j + q_i . pk[r] + k_j . pq[r]) * attention_scale`, `r`
    the log bucket of `i - j` (`scores.log_bucket_index`). The bias is a
    score object: every attention path runs it (dense, blockwise), and
    one bias given to every layer of a stack is one table, as DeBERTa's.

    Args:
        num_heads: int, number of attention heads.
        key_dim: int, size of each query/key head.
        score_mod: the `scores.DisentangledRelativeBias` (its
            `embedding_dim` is the layer's input features).
        causal: bool, as `SelfAttention`'s.
        **kwargs: the other arguments of `SelfAttention` /
            `MultiHeadAttention` (`value_dim`, `num_key_value_heads`,
            `dropout`, `use_bias`, `output_shape`, initializers,
            `attention_scale`, ...) and base layer arguments.
            `attention_scale` defaults to DeBERTa's `1 / sqrt(3 *
            key_dim)` (three terms). Rotary positions and `qk_norm` are
            refused: the relative terms are the positions.

    Call arguments: those of `SelfAttention`, without a `cache` (the
    relative terms index the queries from position 0: an encoder's
    attention); `dropout` also drops entries of the relative table in
    training, as DeBERTa's position dropout.

    Example:

    >>> import numpy as np
    >>> import keras_attention as ka
    >>> bias = ka.scores.DisentangledRelativeBias(
    ...     embedding_dim=16, bucket_size=4, max_distance=16)
    >>> layer = ka.layers.DisentangledSelfAttention(2, 8, score_mod=bias)
    >>> tuple(layer(np.ones((2, 6, 16), "float32")).shape)
    (2, 6, 16)
    >>> tuple(bias.embeddings.shape)  # (2 * bucket_size, embedding_dim)
    (8, 16)

    References:
        - He et al., 2021, "DeBERTa: Decoding-enhanced BERT with
          Disentangled Attention".
        - He et al., 2023, "DeBERTaV3: Improving DeBERTa using
          ELECTRA-Style Pre-Training with Gradient-Disentangled Embedding
          Sharing".
    """

    def __init__(self, num_heads, key_dim, score_mod, causal=False, **kwargs):
        if not isinstance(score_mod, DisentangledRelativeBias):
            raise TypeError(
                "`score_mod` of DisentangledSelfAttention must be a "
                "`keras_attention.scores.DisentangledRelativeBias`. "
                f"Received: score_mod={score_mod!r}"
            )
        for name in ("rotary_max_wavelength", "qk_norm"):
            if kwargs.get(name) is not None:
                raise ValueError(
                    "DisentangledSelfAttention takes its positions from "
                    f"its relative terms: `{name}` does not apply. "
                    f"Received: {name}={kwargs[name]!r}"
                )
        if kwargs.get("attention_scale") is None:
            key_dim = validation.check_positive_int("key_dim", key_dim)
            kwargs["attention_scale"] = 1.0 / math.sqrt(3 * key_dim)
        super().__init__(
            num_heads, key_dim, causal=causal, score_mod=score_mod, **kwargs
        )

    def build(self, inputs_shape):
        features = inputs_shape[-1]
        if features is not None and features != self.score_mod.embedding_dim:
            raise ValueError(
                "The inputs' features must equal the relative table's "
                "`embedding_dim` (the layer projects both with its query "
                f"and key projections). Received: inputs features "
                f"{features!r}, embedding_dim="
                f"{self.score_mod.embedding_dim!r}"
            )
        super().build(inputs_shape)

    def call(
        self,
        inputs,
        mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        cache=None,
        cache_update_index=None,
        mod_inputs=None,
        step_inputs=None,
        segment_ids=None,
        cache_sink_tokens=None,
        positions=None,
        padding_mask=None,
    ):
        for name, value in (
            ("cache", cache),
            ("cache_sink_tokens", cache_sink_tokens),
        ):
            if value is not None:
                raise ValueError(
                    f"DisentangledSelfAttention takes no `{name}`: its "
                    "relative terms index the queries from position 0. "
                    f"Received: {name}={value!r}"
                )
        return super().call(
            inputs,
            mask=mask,
            attention_mask=attention_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            cache_update_index=cache_update_index,
            mod_inputs=mod_inputs,
            step_inputs=step_inputs,
            segment_ids=segment_ids,
            positions=positions,
            padding_mask=padding_mask,
        )

    def _attend(self, call, q, k, v):
        """The attention step with the relative terms bound: the query
        and key heads `q`, `k` of this call and the layer's projections
        of the relative table."""
        inputs = dict(call.mod_inputs or {})
        given = sorted(set(inputs) & set(self.score_mod.inputs))
        if given:
            raise ValueError(
                f"DisentangledSelfAttention binds {given!r} of its "
                "`score_mod` itself. Received: mod_inputs keys="
                f"{sorted(inputs)!r}"
            )
        table = self.score_mod.position_embeddings()
        table = ops.cast(table[None], self.compute_dtype)
        if self.dropout > 0:
            table = self._dropout_layer(table, training=call.training)
        inputs.update(
            query=q,
            key=k,
            position_query=self._scale_query(self._query_dense(table))[0],
            position_key=self._key_dense(table)[0],
        )
        return super()._attend(call.replace(mod_inputs=inputs), q, k, v)
