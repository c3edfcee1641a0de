"""`SharedKVSelfAttention`: self-attention whose keys and values may come
from another layer (Gemma 4's KV sharing across layers), from the key
projection itself (Gemma 4's `attention_k_eq_v`), and be normalized
(Gemma 4's v-norm), with Gemma 4's proportional partial rotary positions;
`KVShare`, the channel between a source layer and the layers that read
it.

KV sharing (Gemma 4, `num_kv_shared_layers`): the last layers of a stack
compute no keys or values of their own; each attends with its own queries
to the keys and values of an earlier layer, its source, computed in the
same pass. Source and readers hold one `KVShare`. Without a cache the
source publishes the keys and values it attends to, `(batch, T,
kv_heads, key_dim)`; with its cache (`init_cache`'s) it publishes the
cache it returns, written at this call's positions. Each reader, called
after the source in the same pass (the order of a decoder's blocks),
attends to what was published. A reader stores nothing: its `init_cache`
is an empty tuple, so a decoder's generation cache holds each shared
entry once, in the source's cache. A publication is read by the readers
that hold the channel, once each, then dropped: a reader called without
its source having run before it in the same pass raises `ValueError`.

`.keras` files keep the link: the channel is saved as one shared object
(the `shared_object_id` of Keras's saving) and loads as one.
"""

import keras
from keras import ops

from keras_attention.layers import _kv_cache
from keras_attention.layers.rotary_embedding import RotaryEmbedding
from keras_attention.layers.self_attention import SelfAttention
from keras_attention.ops.scoring import softmax_dtype
from keras_attention.utils import keras_utils
from keras_attention.utils import validation

ROLES = ("source", "reader")
VALUE_NORMS = (None, "rms")


@keras.saving.register_keras_serializable(package="keras_attention")
class KVShare:
    """The channel through which a `SharedKVSelfAttention` (its source)
    hands the keys and values it computed to the layers that read them
    (see the module docstring).

    Args:
        name: optional str, a label shown in errors.

    Example:

    >>> import numpy as np
    >>> from keras_attention.layers import KVShare, SharedKVSelfAttention
    >>> share = KVShare("global")
    >>> source = SharedKVSelfAttention(
    ...     2, 4, causal=True, kv_share=share, kv_share_role="source")
    >>> reader = SharedKVSelfAttention(
    ...     2, 4, causal=True, kv_share=share, kv_share_role="reader")
    >>> x = np.ones((1, 3, 8), "float32")
    >>> y = reader(source(x))  # the source runs first
    >>> sorted({w.path.split("/")[-2] for w in reader.weights})
    ['attention_output', 'query']
    """

    def __init__(self, name=None):
        if name is not None and not isinstance(name, str):
            raise TypeError(f"`name` must be a str. Received: name={name!r}")
        self.name = name
        self._readers = 0
        self._published = None
        self._left = 0

    def _add_reader(self):
        self._readers += 1

    def publish(self, kind, value):
        """Called by the source: `kind` "keys_values" (a pair of
        tensors) or "cache" (its updated own cache)."""
        self._published = (kind, value)
        self._left = self._readers

    def read(self, kind, reader):
        """Called by a reader: what the source published in this pass
        (`kind` as `publish`'s), `ValueError` naming the reader when the
        source has published nothing (or the other kind)."""
        if self._published is None or self._published[0] != kind:
            got = None if self._published is None else self._published[0]
            raise ValueError(
                f"Layer {reader!r} reads the keys and values of its source "
                f"(KVShare {self.name!r}), which must run before it in the "
                f"same pass, with a cache exactly when it has one. Received: "
                f"{kind!r} wanted, {got!r} published"
            )
        value = self._published[1]
        self._left -= 1
        if self._left <= 0:  # every reader has read it: drop it
            self._published = None
        return value

    def get_config(self):
        return {"name": self.name}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        return f"KVShare(name={self.name!r})"


def _rms(x, epsilon):
    """`x / sqrt(mean(x^2) + eps)` over the last axis, no weight, in at
    least float32 (Gemma 4's v-norm)."""
    dtype = softmax_dtype(x.dtype)
    y = ops.cast(x, dtype)
    square_sum = ops.sum(ops.square(y), axis=-1, keepdims=True)
    epsilon = keras_utils.constant(epsilon, dtype)
    y = y * ops.rsqrt(square_sum / y.shape[-1] + epsilon)
    return ops.cast(y, x.dtype)


@keras.saving.register_keras_serializable(package="keras_attention")
class SharedKVSelfAttention(SelfAttention):
    """`SelfAttention` with Gemma 4's key/value options: KV sharing across
    layers, values from the key projection, and the value norm.

    - `kv_share` with `kv_share_role="source"`: the layer publishes the
      keys and values it attends to (or its updated cache) on the
      `KVShare` at each call; with `"reader"`: it has no key or value
      projection (nor key norm) and attends with its own queries to what
      its source published in the same pass (see the module docstring):
      its cache (`init_cache`) is empty, the source's holds the entries.
      The reader's `key_dim` and `num_key_value_heads` must be the
      source's.
    - `values_from_keys=True` (Gemma 4's `attention_k_eq_v`): no value
      projection; the values are the key projection before its QK-norm
      and rotary positions (`value_dim` must be `key_dim`).
    - `value_norm="rms"` (Gemma 4's v-norm): each value head divided by
      its root mean square, `v / sqrt(mean(v^2) + qk_norm_epsilon)`, no
      weight.
    - `proportional_rotary=True` (Gemma 4's "proportional" RoPE, with
      `rotary_fraction` below 1): the rotary positions rotate the pairs
      `(k, k + key_dim / 2)` for `k < r / 2` (`r` the rotated features
      of `rotary_fraction`), with the frequencies of the whole head,
      `max_wavelength ** (-2k / key_dim)`; the other pairs pass
      unrotated. (`rotary_fraction` alone rotates the first `r`
      features with frequencies over `r`.)

    The rolling cache (`init_cache(..., sink_tokens=...)`,
    `cache_sink_tokens`) is refused with any of these options: decode
    with full caches (`generate(..., cache="full")`, or give the window
    as a `mask_mod`).

    Args:
        num_heads: int, as `SelfAttention`'s.
        key_dim: int, as `SelfAttention`'s.
        causal: bool, as `SelfAttention`'s.
        kv_share: optional `KVShare`.
        kv_share_role: "source" or "reader" (with `kv_share` only).
        values_from_keys: bool (not for a reader).
        value_norm: None or "rms" (not for a reader).
        proportional_rotary: bool (needs `rotary_max_wavelength`).
        **kwargs: `SelfAttention`'s other arguments.

    References:
        - Gemma Team, 2026, Gemma 4 (transformers' and keras-hub's
          `gemma4`).

    Example (a global layer of Gemma 4: values from the keys, normed):

    >>> import numpy as np
    >>> from keras_attention.layers import SharedKVSelfAttention
    >>> layer = SharedKVSelfAttention(
    ...     2, 4, causal=True, values_from_keys=True, value_norm="rms")
    >>> tuple(layer(np.ones((1, 3, 8), "float32")).shape)
    (1, 3, 8)
    >>> sorted({w.path.split("/")[-2] for w in layer.weights})
    ['attention_output', 'key', 'query']
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        causal=False,
        *,
        kv_share=None,
        kv_share_role=None,
        values_from_keys=False,
        value_norm=None,
        proportional_rotary=False,
        **kwargs,
    ):
        super().__init__(num_heads, key_dim, causal=causal, **kwargs)
        self.proportional_rotary = validation.check_bool(
            "proportional_rotary", proportional_rotary
        )
        self._proportional = None
        if self.proportional_rotary:
            if self._rotary is None:
                raise ValueError(
                    "`proportional_rotary` places rotary positions: it "
                    "needs `rotary_max_wavelength`. Received: "
                    "proportional_rotary=True, rotary_max_wavelength=None"
                )
            self._proportional = RotaryEmbedding(
                max_wavelength=self.rotary_max_wavelength,
                denominator_dim=self.key_dim,
                **(self.rotary_scaling or {}),
                dtype=self.dtype_policy,
                name="proportional_rotary_embedding",
            )
        if kv_share is not None and not isinstance(kv_share, KVShare):
            raise TypeError(
                "`kv_share` must be a `KVShare` or None. Received: "
                f"kv_share={kv_share!r}"
            )
        if (kv_share is None) != (kv_share_role is None) or (
            kv_share_role is not None and kv_share_role not in ROLES
        ):
            raise ValueError(
                f"`kv_share_role` must be one of {ROLES} with `kv_share`, "
                "and None without. Received: "
                f"kv_share={kv_share!r}, kv_share_role={kv_share_role!r}"
            )
        self.values_from_keys = validation.check_bool(
            "values_from_keys", values_from_keys
        )
        if value_norm not in VALUE_NORMS:
            raise ValueError(
                f"`value_norm` must be one of {VALUE_NORMS}. Received: "
                f"value_norm={value_norm!r}"
            )
        self.value_norm = value_norm
        self.kv_share, self.kv_share_role = kv_share, kv_share_role
        if self._reads and (values_from_keys or value_norm is not None):
            raise ValueError(
                "A reader of shared keys and values computes none: "
                "`values_from_keys` and `value_norm` cannot apply. "
                f"Received: values_from_keys={values_from_keys!r}, "
                f"value_norm={value_norm!r}, kv_share_role='reader'"
            )
        if values_from_keys and self.value_dim != self.key_dim:
            raise ValueError(
                "`values_from_keys` takes the values from the key "
                "projection: `value_dim` must be `key_dim`. Received: "
                f"value_dim={self.value_dim!r}, key_dim={self.key_dim!r}"
            )
        if self._reads:
            kv_share._add_reader()

    @property
    def _reads(self):
        return self.kv_share_role == "reader"

    @property
    def _custom(self):
        """Whether any option of this class is on."""
        return (
            self.kv_share is not None
            or self.values_from_keys
            or self.value_norm is not None
        )

    def _rotate(self, x, start_index, positions=None):
        if self._proportional is None:
            return super()._rotate(x, start_index, positions)
        half, part = x.shape[-1] // 2, self._rotary_dims // 2
        x1, x2 = x[..., :half], x[..., half:]
        rotated = self._proportional(
            ops.concatenate([x1[..., :part], x2[..., :part]], axis=-1),
            start_index=start_index,
            positions=positions,
        )
        return ops.concatenate(
            [rotated[..., :part], x1[..., part:]]
            + [rotated[..., part:], x2[..., part:]],
            axis=-1,
        )

    # Weights: none for what a reader or `values_from_keys` never runs.

    def _projection(self, name, heads, dim, activation=None):
        skipped = ("key", "value") if self._reads else ()
        if self.values_from_keys:
            skipped = ("value",)
        if name in skipped:
            return keras.layers.Identity(name=name, dtype=self.dtype_policy)
        return super()._projection(name, heads, dim, activation)

    def _head_norm(self, name, heads):
        if self._reads and name == "key_norm":
            return None
        return super()._head_norm(name, heads)

    # The cache protocol.

    def init_cache(self, batch_size, max_length, dtype=None, sink_tokens=None):
        """`SelfAttention`'s cache; a reader's is empty, `()` (its
        source's holds the keys and values). A rolling cache
        (`sink_tokens`) is refused with this class's options."""
        if sink_tokens is not None and self._custom:
            raise ValueError(
                f"Layer {self.name!r} (shared keys and values, values from "
                "keys or a value norm) keeps no rolling cache: decode with "
                f'cache="full". Received: sink_tokens={sink_tokens!r}'
            )
        if self._reads:
            return ()
        return super().init_cache(batch_size, max_length, dtype, sink_tokens)

    def cache_overwrites_positions(self, cache):
        if self._reads:
            return True  # it writes nothing; its source's cache does
        return super().cache_overwrites_positions(cache)

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
        if cache_sink_tokens is not None and self._custom:
            raise ValueError(
                f"Layer {self.name!r} keeps no rolling cache. Received: "
                f"cache_sink_tokens={cache_sink_tokens!r}"
            )
        own = cache
        if self._reads and cache is not None:
            if not (isinstance(cache, tuple) and not cache):
                raise ValueError(
                    f"The cache of reader {self.name!r} is its "
                    "`init_cache()`'s, an empty tuple. Received: cache of "
                    f"type {type(cache).__name__!r}"
                )
            cache = self.kv_share.read("cache", self.name)
            shape = tuple(cache["keys_values"].shape)  # (b, 2, S, kv, d)
            self._check_source_sizes(shape[-2], shape[-1], shape[-1])
        outputs = super().call(
            inputs,
            mask=mask,
            attention_mask=attention_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            cache=cache,
            cache_update_index=cache_update_index,
            mod_inputs=mod_inputs,
            step_inputs=step_inputs,
            segment_ids=segment_ids,
            cache_sink_tokens=cache_sink_tokens,
            positions=positions,
            padding_mask=padding_mask,
        )
        if own is None:
            return outputs
        if self._reads:
            return outputs[:-1] + (own,)
        if self.kv_share is not None:
            if not _kv_cache.is_own_cache(own):
                raise ValueError(
                    f"Source layer {self.name!r} shares the cache of its "
                    "`init_cache()`, a dict. Received: cache of type "
                    f"{type(own).__name__!r}"
                )
            self.kv_share.publish("cache", outputs[-1])
        return outputs

    def _keys_and_values(self, call, positions):
        cache, index = call.cache, call.cache_update_index
        if self._reads:
            if cache is None:
                k, v = self.kv_share.read("keys_values", self.name)
                self._check_source_sizes(k.shape[-2], k.shape[-1], v.shape[-1])
                return k, v, None
            return cache[:, 0], cache[:, 1], cache  # read, not written
        if not (self.values_from_keys or self.value_norm):
            k, v, cache = super()._keys_and_values(call, positions)
        else:
            if cache is not None and index is None:
                return cache[:, 0], cache[:, 1], cache  # precomputed
            raw = self._key_dense(call.key)
            key = raw if self.key_norm is None else self._key_norm(raw)
            offset = 0 if cache is None else call.offset
            k = self._rotate(key, offset, positions)
            v = raw if self.values_from_keys else self._value_dense(call.value)
            if self.value_norm is not None:
                v = _rms(v, self.qk_norm_epsilon)
            if cache is not None:
                start = (0, index, 0, 0)
                k = ops.slice_update(cache[:, 0], start, k)
                v = ops.slice_update(cache[:, 1], start, v)
                cache = ops.stack([k, v], axis=1)
        if cache is None and self.kv_share is not None:
            self.kv_share.publish("keys_values", (k, v))
        return k, v, cache

    def _check_source_sizes(self, kv_heads, key_dim, value_dim):
        """A reader's key/value heads and sizes must be those its source
        published (a mismatch would broadcast or fail inside a matmul)."""
        want = (self._kv_heads, self.key_dim, self.value_dim)
        got = (kv_heads, key_dim, value_dim)
        if any(g is not None and g != w for g, w in zip(got, want)):
            raise ValueError(
                f"Reader {self.name!r} attends to the keys and values of "
                f"its source (KVShare {self.kv_share.name!r}): its "
                "num_key_value_heads, key_dim and value_dim must be the "
                f"source's, {got!r}. Received: num_key_value_heads="
                f"{self._kv_heads!r}, key_dim={self.key_dim!r}, "
                f"value_dim={self.value_dim!r}"
            )

    def compute_cache(self, value, key=None):
        if self._custom:
            raise ValueError(
                f"Layer {self.name!r} attends to its own sequence only: "
                "`compute_cache` (a fixed memory) cannot apply to shared "
                "keys and values, values from keys or a value norm."
            )
        return super().compute_cache(value, key)

    def get_config(self):
        config = super().get_config()
        if self.kv_share is not None:
            share = keras.saving.serialize_keras_object(self.kv_share)
            if keras_utils.saving_shared_objects():
                # Keras copies nested configs: mark every holder so that
                # the channel loads as one object (as `mods.base` does).
                share["shared_object_id"] = id(self.kv_share)
            config["kv_share"] = share
            config["kv_share_role"] = self.kv_share_role
        config["values_from_keys"] = self.values_from_keys
        config["value_norm"] = self.value_norm
        config["proportional_rotary"] = self.proportional_rotary
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("kv_share"), dict):
            config["kv_share"] = keras.saving.deserialize_keras_object(
                config["kv_share"]
            )
        return super().from_config(config)
