"""DeepSeek Sparse Attention in `MultiHeadLatentAttention(indexer={...})`
(DeepSeek-V3.2, `transformers`' `DeepseekV32Attention`): a
`LightningIndexer` names each query's top-k keys and the attention reads
only those (`ops.topk_attention`), in the naive or the absorbed form.

- The indexer reads the hidden states (its keys and head weights) and
  the query latent `q_a_layernorm(q_a_proj(x))` (its queries), so it
  needs `q_lora_rank`; its rotary positions are the attention's
  (`rope_theta`, `rotary_scaling`, `qk_rope_head_dim` rotated features,
  in halves whatever `rope_interleave`; none with `rope_theta=None`).
- The keys each query may select are those it may attend to (causal,
  padding, `attention_mask`, the cache's written slots).
- Caches: the indexer's keys `(batch, max_length, head_dim)` live beside
  the latent, as `"index_keys"` in the layer's own cache (`init_cache`);
  a bare cache is the pair `(latent, index_keys)`, and so is the cache
  returned with it.
- Attention weights (`return_attention_scores`) and dropout on them run
  the dense path under the mask of the kept keys; otherwise the top-k
  path runs (memory O(T * top_k)).
"""

from keras import ops

from keras_attention.layers.lightning_indexer import LightningIndexer
from keras_attention.layers.lightning_indexer import selection_mask
from keras_attention.ops.attention import dot_product_attention
from keras_attention.ops.topk_attention import topk_attention

# The keys of `indexer={...}`; the rotary arguments are the attention's.
REQUIRED = ("num_heads", "head_dim", "top_k")
OPTIONAL = ("layer_norm_epsilon", "kernel_initializer")


def check_indexer(indexer, q_lora_rank):
    """`indexer` of `MultiHeadLatentAttention`, checked: None, or a dict
    of `LightningIndexer` arguments (`num_heads`, `head_dim`, `top_k`,
    optionally `layer_norm_epsilon`, `kernel_initializer`), with a
    `q_lora_rank` (the indexer's queries read the query latent). A plain
    dict copy, or None."""
    if indexer is None:
        return None
    if not isinstance(indexer, dict):
        raise TypeError(
            "`indexer` must be None or a dict of LightningIndexer arguments "
            f"{REQUIRED + OPTIONAL}. Received: indexer={indexer!r}"
        )
    missing = [k for k in REQUIRED if k not in indexer]
    unknown = sorted(set(indexer) - set(REQUIRED + OPTIONAL))
    if missing or unknown:
        raise ValueError(
            f"`indexer` takes the keys {REQUIRED} and optionally {OPTIONAL} "
            "(its rotary positions are the attention's). Missing: "
            f"{missing}, unknown: {unknown}. Received: indexer={indexer!r}"
        )
    if q_lora_rank is None:
        raise ValueError(
            "`indexer` needs `q_lora_rank`: the indexer's queries read the "
            "query latent q_a_layernorm(q_a_proj(x)), as DeepSeek-V3.2's. "
            f"Received: q_lora_rank=None, indexer={indexer!r}"
        )
    return dict(indexer)


def _plain_mask(attention_mask):
    """An attention mask as `(b|1, T, S)` for the selection: per-head
    masks cannot apply (one selection serves every head)."""
    if attention_mask is None or len(attention_mask.shape) < 4:
        return attention_mask
    if attention_mask.shape[1] != 1:
        raise ValueError(
            "With an `indexer`, one selection of keys serves every head: "
            "`attention_mask` may not differ per head. Received: "
            f"attention_mask.shape={tuple(attention_mask.shape)}"
        )
    return attention_mask[:, 0]


def attend(query, key, value, indices=None, **options):
    """`dot_product_attention(query, key, value, **options)`, or, with
    `indices` (an indexed layer's), top-k attention over them: on the
    top-k path, or on the dense one under the kept keys' mask when the
    weights are returned or dropped out."""
    if indices is None:
        return dot_product_attention(query, key, value, **options)
    if options["return_weights"] or options["dropout_fn"] is not None:
        kept = selection_mask(indices, ops.shape(key)[1])
        options = dict(options, attention_mask=kept[:, None])
        return dot_product_attention(query, key, value, **options)
    return topk_attention(
        query,
        key,
        value,
        indices,
        scale=options["scale"],
        query_mask=options["query_mask"],
    )


class IndexedLatent:
    """The indexer's part of `MultiHeadLatentAttention` (a mixin)."""

    def _make_indexer(self, indexer):
        """The `LightningIndexer` sublayer of `indexer` (checked), or
        None."""
        self._indexer_config = check_indexer(indexer, self.q_lora_rank)
        if self._indexer_config is None:
            return None
        # NoPE (`rope_theta=None`): no rotary positions in the indexer
        # either (its base is then unused).
        nope = self.rope_theta is None
        return LightningIndexer(
            **self._indexer_config,
            rope_head_dim=0 if nope else self.qk_rope_head_dim,
            rope_theta=10000.0 if nope else self.rope_theta,
            rotary_scaling=self.rotary_scaling,
            dtype=self.dtype_policy,
            name="indexer",
        )

    def _build_indexer(self, hidden):
        if self.indexer is not None:
            self.indexer.build(
                (None, None, hidden), (None, None, self.q_lora_rank)
            )

    def _split_cache(self, cache):
        """`(latent, index_keys)` of a call's bare cache: the pair with an
        indexer, the latent alone (keys None) without."""
        pair = isinstance(cache, (tuple, list))
        if cache is None or not pair and self.indexer is None:
            return cache, None
        if pair and self.indexer is not None and len(cache) == 2:
            shape = tuple(getattr(cache[1], "shape", ()))
            width = self.indexer.head_dim
            if len(shape) != 3 or shape[-1] not in (None, width):
                raise ValueError(
                    "The indexer's key cache must have shape (batch, "
                    f"max_length, head_dim) = (batch, max_length, {width}). "
                    f"Received: index_keys.shape={shape!r}"
                )
            return tuple(cache)
        raise ValueError(
            "A layer with an `indexer` takes the pair (latent, index_keys) "
            "as a bare cache (or `init_cache`'s dict), and one without a "
            f"latent tensor. Received: a {type(cache).__name__}, "
            f"indexer={self._indexer_config!r}"
        )

    def _bare_cache(self, own, latent):
        """The bare cache of an own cache's call."""
        if self.indexer is None:
            return latent
        if "index_keys" not in own:
            raise ValueError(
                "A layer with an `indexer` keeps the indexer's keys in its "
                "cache: pass its own `init_cache()`, which holds "
                f"'index_keys'. Received: a cache of {sorted(own)!r}"
            )
        return latent, own["index_keys"]

    def _close_cache(self, close, updated):
        """The updated own cache (`close`: `_kv_cache.open_cache`'s)."""
        if self.indexer is None:
            return close(updated)
        latent, keys = updated
        return dict(close(latent), index_keys=keys)

    def _cache_out(self, latent, keys):
        return latent if self.indexer is None else (latent, keys)

    def _init_index_cache(self, cache, batch_size, max_length, dtype):
        """`init_cache`'s dict with the indexer's keys."""
        if self.indexer is None:
            return cache
        dtype = cache["latent"].dtype if dtype is None else dtype
        shape = (batch_size, max_length, self.indexer.head_dim)
        return dict(cache, index_keys=ops.zeros(shape, dtype))

    def _select(self, query, q_latent, start, positions, masks, keys):
        """`(masks, keys)`: the call's `masks` with the kept keys
        (`indices`), and the indexer's keys, this call's written into the
        cache `keys` (None: uncached). The scores are formed a tile of
        queries at a time (`LightningIndexer.top_k_indices`)."""
        indexer = self.indexer
        new = indexer.keys(query, start, positions)
        if keys is not None:
            keys = ops.slice_update(
                ops.cast(keys, new.dtype), (0, start, 0), new
            )
        padding = masks["query_mask"]
        allowed = indexer.allowed_keys(
            query,
            new if keys is None else keys,
            start,
            masks["causal"],
            padding,
            _plain_mask(masks["attention_mask"]),
            keys is not None,
        )
        # Integers and a bool mask: the choice carries no gradient (the
        # indexer learns from `LightningIndexer.distillation_loss`).
        queries = indexer.queries(q_latent, start, positions)
        indices = indexer.top_k_indices(
            query, queries, new if keys is None else keys, allowed
        )
        return dict(masks, indices=indices), keys
