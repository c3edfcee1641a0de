"""Mask matrix: every layer that takes masks, under every way of passing them.

For each layer the output is compared with a NumPy reference computed with
the layer's own weights (`tests/references.py`), over every combination of

- a Keras mask on each sequence input (on / off),
- the explicit mask arguments (`mask`, `query_mask`, `value_mask`,
  `context_mask`, `memory_mask`, `padding_mask`, ...; on / off),
- `attention_mask` (and the decoder block's `cross_attention_mask`; given
  or not), where the layer has one,
- `use_causal_mask` (call argument) or `causal` (constructor), where the
  layer has one,

in three call modes: eager, a functional `keras.Model` built on
`keras.Input`s (masks attached inside the model, explicit masks as model
inputs), and `tf.function` (TensorFlow only).

The Keras masks and the explicit masks use different padding patterns, so
the matrix also checks precedence: an explicit mask replaces the input's
Keras mask (as documented), and a Keras mask is never dropped because
another tensor argument (`attention_mask=`) is present (issue 10, defect 2).

Every case also checks the padding property: replacing the values at the
padded positions (of the effective masks) by large noise changes no output
at a valid position.

References: `MultiHeadAttention` (also with Keras 3.15's `use_gate` and
`sliding_window`, served by the banded path), `SelfAttention`, the
layers holding a mask object of `keras_attention.mods` (`mask_mod=`:
chunked causal, Keras's sliding window, prefix-LM, documents from segment
ids; their NumPy rules in `MOD_RULES`, and-ed into the reference's mask),
`CausalSelfAttention`,
`CrossAttention`, `LocalSelfAttention`, `AttentionPooling`,
`BahdanauAttention` and `LuongAttention` (global, local-m, local-p) are
checked against NumPy formulas on every output row (padded queries
included: zero attention, so the output projection's bias, or zeros).
The transformer blocks are checked against NumPy too (layer norm, feed
forward and attention in NumPy, `references.encoder_block` /
`references.decoder_block`), on valid rows. `AttentionRNNDecoder` is
checked against a reference built from its sublayers: its own `rnn_cell`
(a Keras GRU cell) stepped in Python, with the Bahdanau attention in NumPy
and padded target steps keeping the state and giving zeros.
`KimiDeltaAttention` (padding only, causal by design) is checked on
every row against `references.kimi_delta_attention`: its projections,
short convolution, per-channel gated delta rule token by token, output
gate and norm in NumPy, padded tokens taken out of the row (zero
output, no state change). `MultiHeadLatentAttention` (DeepSeek's MLA)
is checked against `references.multi_head_latent_attention`, also with
`indexer={...}` (DeepSeek sparse attention): each query attends to the
top-2 keys of the indexer's NumPy scores among those the masks allow,
whose choice the reference checks has clear gaps (no near ties).

Size: see `MATRIX` below; `test_matrix_size` prints
`layers x combinations x call modes`.
"""

import itertools

import keras
import numpy as np
import pytest
import references
from keras import ops
from keras.src.backend import get_keras_mask

from keras_attention import layers as ka
from keras_attention import masks as masks_lib
from keras_attention import mods

BACKEND = keras.backend.backend()
B, T, S, F = 2, 5, 6, 8
RNG = np.random.default_rng(10)
X = RNG.normal(size=(B, T, F)).astype("float32")  # queries / sequences
C = RNG.normal(size=(B, S, F)).astype("float32")  # context / memory / values

# Keras-mask and explicit-mask patterns differ (precedence is checked), and
# pad on the left too, so that causal queries see padded keys.
KERAS_PADDING = {
    T: np.array([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]], bool),
    S: np.array([[1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1]], bool),
}
EXPLICIT_PADDING = {
    T: np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]], bool),
    S: np.array([[0, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], bool),
}


def _attention_mask(tk, seed):
    """(B, T, tk) random mask, True on key 0..: every row keeps a key."""
    m = np.random.default_rng(seed).random((B, T, tk)) < 0.6
    m[:, np.arange(T), np.arange(T) % tk] = True
    return m


ATTENTION_MASKS = {T: _attention_mask(T, 1), S: _attention_mask(S, 2)}
CAUSAL = {tk: np.tril(np.ones((T, tk), bool)) for tk in (T, S)}


def np_(x):
    return ops.convert_to_numpy(x)


def pad4(q_valid, k_valid):
    """(b, 1, i, j) mask from query and key padding masks."""
    return q_valid[:, None, :, None] & k_valid[:, None, None, :]


class WithKerasMask(keras.layers.Layer):
    """`[x, valid]` -> a copy of `x` carrying `valid` as its Keras mask (works
    eagerly, in `tf.function` and on `keras.Input`s, on every backend)."""

    def call(self, inputs):
        return inputs[0] * 1.0

    def compute_mask(self, inputs, previous_mask=None):
        return ops.cast(inputs[1], "bool")


# --- Layer specifications ----------------------------------------------------
#
# inputs: (sequence array, explicit mask argument name) per positional tensor.
# attention: names of the attention-mask arguments and their key lengths.
# causal: None, "call" (use_causal_mask=) or "init" (causal= constructor).
# core: compare every output row (True) or only valid query rows (False).


def _mha_ref(layer, xs, valid, attn, causal):
    mask = pad4(valid[0], valid[1])
    if attn:
        mask = mask & attn["attention_mask"][:, None]
    if causal:
        mask = mask & CAUSAL[xs[1].shape[1]]
    return references.multi_head_attention(layer, xs[0], xs[1], mask=mask)[0]


def _qk_norm_sinks_ref(layer, xs, valid, attn, causal):
    mask = pad4(valid[0], valid[1])
    if attn:
        mask = mask & attn["attention_mask"][:, None]
    if causal:
        mask = mask & CAUSAL[xs[1].shape[1]]
    return references.qk_norm_sinks_attention(layer, xs[0], xs[1], mask)[0]


def _gated_window_ref(layer, xs, valid, attn, causal):
    """`_mha_ref` with Keras 3.15's sliding window: |i - j| < w, and with
    `use_causal_mask` i - w < j <= i (the gate is in the reference)."""
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    window = np.abs(i - j) < layer.sliding_window
    mask = pad4(valid[0], valid[1]) & window
    if attn:
        mask = mask & attn["attention_mask"][:, None]
    if causal:
        mask = mask & CAUSAL[T]
    return references.multi_head_attention(layer, xs[0], xs[1], mask=mask)[0]


def _self_ref(layer, xs, valid, attn, causal):
    mask = pad4(valid[0], valid[0])
    if attn:
        mask = mask & attn["attention_mask"][:, None]
    if causal:
        mask = mask & CAUSAL[T]
    if isinstance(layer, ka.LocalSelfAttention):
        mask = mask & np_(masks_lib.sliding_window_mask(T, layer.window_bounds))
    return references.multi_head_attention(layer, xs[0], xs[0], mask=mask)[0]


def _pool_ref(layer, xs, valid, attn, causal):
    return references.attention_pooling(layer, xs[0], valid[0])[0]


def _bahdanau_ref(layer, xs, valid, attn, causal):
    return references.bahdanau(layer, xs[0], xs[1], valid[1], valid[0])[0]


def _luong_ref(layer, xs, valid, attn, causal):
    return references.luong(layer, xs[0], xs[1], valid[1], valid[0])[0]


def _rnn_decoder_ref(decoder, xs, valid, attn, causal):
    """Bahdanau-style step: c_t = a(s_{t-1}, h); s_t = GRU(s_{t-1}, [y_t; c_t]);
    a padded target step keeps the state and outputs zeros."""
    y, memory = xs
    s = np.zeros((B, decoder.units), "float32")
    outputs = []
    for t in range(T):
        c, _ = references.bahdanau(
            decoder.attention,
            s[:, None],
            memory,
            valid[1],
            np.ones((B, 1), bool),
        )
        new_s, _ = decoder.rnn_cell(
            np.concatenate([y[:, t], c[:, 0]], -1).astype("float32"), [s]
        )
        keep = valid[0][:, t, None]
        s = np.where(keep, np_(new_s), s)
        outputs.append(np.where(keep, s, 0.0))
    return np.stack(outputs, 1)


def _encoder_block_ref(block, xs, valid, attn, causal):
    mask = pad4(valid[0], valid[0])
    if attn:
        mask = mask & attn["attention_mask"][:, None]
    if causal:
        mask = mask & CAUSAL[T]
    return references.encoder_block(block, xs[0].astype("float64"), mask)


def _decoder_block_ref(block, xs, valid, attn, causal):
    self_mask = pad4(valid[0], valid[0]) & CAUSAL[T]
    cross_mask = pad4(valid[0], valid[1])
    if attn:
        self_mask = self_mask & attn["attention_mask"][:, None]
        cross_mask = cross_mask & attn["cross_attention_mask"][:, None]
    x, context = (a.astype("float64") for a in xs)
    return references.decoder_block(block, x, context, self_mask, cross_mask)


# Mask objects held by the layers (`mask_mod=`), and their NumPy rules
# `(b|1, T, Tk)`: combined with every way of passing masks.
QI, KJ = np.arange(T)[:, None], np.arange(S)[None, :]
SEGMENTS = np.array([[0, 0, 1, 1, 1], [0, 1, 1, 2, 2]], "int32")
MOD_RULES = {
    "ChunkedCausalMask": (
        lambda: mods.ChunkedCausalMask(2),
        (KJ[:, :T] <= QI) & (KJ[:, :T] // 2 == QI // 2),
    ),
    "KerasSlidingWindowMask": (
        lambda: mods.KerasSlidingWindowMask(2),
        np.abs(QI - KJ) < 2,
    ),
    "PrefixLMMask": (
        lambda: mods.PrefixLMMask(2),
        (KJ[:, :T] <= QI) | (KJ[:, :T] < 2),
    ),
    "DocumentMask": (
        lambda: mods.DocumentMask().bind(segment_ids=SEGMENTS),
        SEGMENTS[:, :, None] == SEGMENTS[:, None, :],
    ),
}


def _with_mod(reference, rule):
    """`reference` with the mask object's rule and-ed into the attention
    mask (every query keeps a key: see the rules above)."""

    def ref(layer, xs, valid, attn, causal):
        tk = xs[-1].shape[1] if len(xs) > 1 else T
        rule_mask = np.broadcast_to(rule[..., :tk], (B, T, tk))
        attn = dict(attn or {})
        attn["attention_mask"] = attn.get("attention_mask", True) & rule_mask
        return reference(layer, xs, valid, attn, causal)

    return ref


def _with_random_sinks(layer):
    """The layer built with non-trivial norm scales and sink logits."""
    layer.build((B, T, F), (B, S, F))
    rng = np.random.default_rng(38)
    for v in layer.weights:
        if "norm" in v.path or v.path.endswith("sinks"):
            v.assign(rng.normal(size=v.shape).astype("float32"))
    return layer


def _kda_ref(layer, xs, valid, attn, causal):
    return references.kimi_delta_attention(layer, xs[0], valid[0])


def _mla_ref(layer, xs, valid, attn, causal):
    mask = pad4(valid[0], valid[0])[:, 0]
    if attn:
        mask = mask & attn["attention_mask"]
    if causal:
        mask = mask & CAUSAL[T]
    return references.multi_head_latent_attention(layer, xs[0], mask)[0]


def _kda():
    """Kimi delta attention with a non-trivial norm scale (`dt_bias` is
    randomized with the biases, `A_log` starts as fla's)."""
    layer = ka.KimiDeltaAttention(
        hidden_size=F, num_heads=2, head_dim=4, conv_kernel_size=3
    )
    layer.build((B, T, F))
    rng = np.random.default_rng(56)
    layer.o_norm.scale.assign((1 + 0.3 * rng.normal(size=4)).astype("float32"))
    return layer


def _mla(indexer=None):
    """MLA with biases and non-trivial norm scales; its weights drawn
    here (the biases and `k_norm`'s beta by `_randomize_biases`), not
    by Keras's seed, so that they do not depend on the layers built
    before. With `indexer`: a lightning indexer whose top-2 choice has
    clear gaps and no ties in every case (smallest gap 0.006;
    `references.top_k_keys` checks it)."""
    layer = ka.MultiHeadLatentAttention(
        num_heads=2,
        kv_lora_rank=4,
        qk_nope_head_dim=2,
        qk_rope_head_dim=2,
        v_head_dim=3,
        q_lora_rank=4 if indexer else None,
        rope_theta=100.0,
        attention_bias=True,
        indexer=indexer,
    )
    layer.build((B, T, F))
    rng = np.random.default_rng(57)
    for v in layer.weights:
        if v.path.endswith(("scale", "gamma")):
            value = 1 + 0.3 * rng.normal(size=v.shape)
        else:  # kernels (and biases, drawn again by `_randomize_biases`)
            value = rng.normal(size=v.shape) / np.sqrt(v.shape[0])
        v.assign(value.astype("float32"))
    return layer


SPECS = {
    "MultiHeadAttention": dict(
        make=lambda causal: ka.MultiHeadAttention(2, 4),
        inputs=((X, "query_mask"), (C, "value_mask")),
        attention={"attention_mask": S},
        causal="call",
        core=True,
        reference=_mha_ref,
    ),
    # QK-norm and learned sinks (a fully masked row: zeros, then bias).
    "MultiHeadAttention[qk_norm,learned_sinks]": dict(
        make=lambda causal: _with_random_sinks(
            ka.MultiHeadAttention(2, 4, qk_norm="rms", learned_sinks=True)
        ),
        inputs=((X, "query_mask"), (C, "value_mask")),
        attention={"attention_mask": S},
        causal="call",
        core=True,
        reference=_qk_norm_sinks_ref,
    ),
    # Keras 3.15's options on self-attention shapes: the banded path.
    "MultiHeadAttention[use_gate,sliding_window]": dict(
        make=lambda causal: ka.MultiHeadAttention(
            2, 4, use_gate=True, sliding_window=2
        ),
        inputs=((X, "query_mask"), (X, "value_mask")),
        attention={"attention_mask": T},
        causal="call",
        core=True,
        reference=_gated_window_ref,
    ),
    "SelfAttention": dict(
        make=lambda causal: ka.SelfAttention(2, 4, causal=causal),
        inputs=((X, "mask"),),
        attention={"attention_mask": T},
        causal="init",
        core=True,
        reference=_self_ref,
    ),
    "CausalSelfAttention": dict(
        make=lambda causal: ka.CausalSelfAttention(2, 4),
        inputs=((X, "mask"),),
        attention={"attention_mask": T},
        causal="fixed",
        core=True,
        reference=_self_ref,
    ),
    "CrossAttention": dict(
        make=lambda causal: ka.CrossAttention(2, 4),
        inputs=((X, "query_mask"), (C, "context_mask")),
        attention={"attention_mask": S},
        causal=None,
        core=True,
        reference=_mha_ref,
    ),
    "LocalSelfAttention": dict(
        make=lambda causal: ka.LocalSelfAttention(
            2, 4, window_size=(2, 1), causal=causal, block_size=2
        ),
        inputs=((X, "mask"),),
        attention={"attention_mask": T},
        causal="init",
        core=True,
        reference=_self_ref,
    ),
    "AttentionPooling": dict(
        make=lambda causal: ka.AttentionPooling(units=4),
        inputs=((X, "mask"),),
        attention={},
        causal=None,
        core=True,
        reference=_pool_ref,
    ),
    "BahdanauAttention": dict(
        make=lambda causal: ka.BahdanauAttention(4),
        inputs=((X, "query_mask"), (C, "value_mask")),
        attention={},
        causal=None,
        core=True,
        reference=_bahdanau_ref,
    ),
    **{
        f"LuongAttention[{alignment}]": dict(
            make=(
                lambda alignment: (
                    lambda causal: ka.LuongAttention(
                        "general",
                        alignment=alignment,
                        window=None if alignment == "global" else 2,
                    )
                )
            )(alignment),
            inputs=((X, "query_mask"), (C, "value_mask")),
            attention={},
            causal=None,
            core=True,
            reference=_luong_ref,
        )
        for alignment in ("global", "local-m", "local-p")
    },
    "AttentionRNNDecoder": dict(
        make=lambda causal: ka.AttentionRNNDecoder(
            8, ka.BahdanauAttention(4), cell="gru", attention_style="bahdanau"
        ),
        inputs=((X, "mask"), (C, "memory_mask")),
        attention={},
        causal=None,
        core=False,
        reference=_rnn_decoder_ref,
    ),
    "TransformerEncoderBlock": dict(
        make=lambda causal: ka.TransformerEncoderBlock(
            2, 16, causal=causal, norm_first=bool(causal)
        ),
        inputs=((X, "padding_mask"),),
        attention={"attention_mask": T},
        causal="init",
        core=False,
        reference=_encoder_block_ref,
    ),
    "TransformerDecoderBlock": dict(
        make=lambda causal: ka.TransformerDecoderBlock(2, 16),
        inputs=((X, "padding_mask"), (C, "context_padding_mask")),
        attention={"attention_mask": T, "cross_attention_mask": S},
        causal="fixed",
        core=False,
        reference=_decoder_block_ref,
    ),
    "MultiHeadAttention[mask_mod=KerasSlidingWindowMask]": dict(
        make=lambda causal: ka.MultiHeadAttention(
            2, 4, mask_mod=MOD_RULES["KerasSlidingWindowMask"][0]()
        ),
        inputs=((X, "query_mask"), (C, "value_mask")),
        attention={"attention_mask": S},
        causal="call",
        core=True,
        reference=_with_mod(_mha_ref, MOD_RULES["KerasSlidingWindowMask"][1]),
    ),
    "SelfAttention[mask_mod=ChunkedCausalMask]": dict(
        make=lambda causal: ka.SelfAttention(
            2, 4, causal=causal, mask_mod=MOD_RULES["ChunkedCausalMask"][0]()
        ),
        inputs=((X, "mask"),),
        attention={"attention_mask": T},
        causal="init",
        core=True,
        reference=_with_mod(_self_ref, MOD_RULES["ChunkedCausalMask"][1]),
    ),
    "CausalSelfAttention[mask_mod=DocumentMask]": dict(
        make=lambda causal: ka.CausalSelfAttention(
            2, 4, mask_mod=MOD_RULES["DocumentMask"][0]()
        ),
        inputs=((X, "mask"),),
        attention={"attention_mask": T},
        causal="fixed",
        core=True,
        reference=_with_mod(_self_ref, MOD_RULES["DocumentMask"][1]),
    ),
    "LocalSelfAttention[mask_mod=PrefixLMMask]": dict(
        make=lambda causal: ka.LocalSelfAttention(
            2,
            4,
            window_size=(2, 1),
            causal=causal,
            block_size=2,
            mask_mod=MOD_RULES["PrefixLMMask"][0](),
        ),
        inputs=((X, "mask"),),
        attention={"attention_mask": T},
        causal="init",
        core=True,
        reference=_with_mod(_self_ref, MOD_RULES["PrefixLMMask"][1]),
    ),
    # Recurrent: padding only (no attention mask), causal by design.
    "KimiDeltaAttention": dict(
        make=lambda causal: _kda(),
        inputs=((X, "mask"),),
        attention={},
        causal="fixed",
        core=True,
        reference=_kda_ref,
    ),
    "MultiHeadLatentAttention": dict(
        make=lambda causal: _mla(),
        inputs=((X, "query_mask"),),
        attention={"attention_mask": T},
        causal="call",
        core=True,
        reference=_mla_ref,
    ),
    # DeepSeek sparse attention: each query attends to its top-2 keys
    # among those the masks allow (the top-k path).
    "MultiHeadLatentAttention[indexer]": dict(
        make=lambda causal: _mla(dict(num_heads=4, head_dim=4, top_k=2)),
        inputs=((X, "query_mask"),),
        attention={"attention_mask": T},
        causal="call",
        core=True,
        reference=_mla_ref,
    ),
}

MODES = ("eager", "functional", "tf_function")
TF_FUNCTION = pytest.mark.tf_only("the tf_function mode")


def _combinations(spec):
    """(keras mask per input, explicit masks, attention masks, causal)."""
    n = len(spec["inputs"])
    keras_masks = list(itertools.product((False, True), repeat=n))
    attention = (False, True) if spec["attention"] else (False,)
    if spec["causal"] in ("call", "init"):
        causal = (False, True)
    else:
        causal = (spec["causal"] == "fixed",)
    return list(
        itertools.product(keras_masks, (False, True), attention, causal)
    )


MATRIX = {name: _combinations(spec) for name, spec in SPECS.items()}
NUM_COMBINATIONS = sum(len(c) for c in MATRIX.values())

# Cases failing because of a defect in a layer this file does not own:
# {(layer, keras_masks, explicit, attention, causal, mode): reason}.
XFAIL = {}

# Layers whose cases join JAX's slow tier (`slow_on_jax`; TensorFlow and
# PyTorch run them all): on JAX each layer's first case compiles its ops
# eagerly. Measured (2026-12-06, loaded 2-core machine, the whole file
# on JAX with `--durations=0`): the two MLA specs' 64 cases took 21 of
# the file's 110 s; Kimi delta attention's 8 stay (6 s).
SLOW_ON_JAX = {
    name: "eager JAX compiles the layer's ops at its first case (MLA and "
    "its indexer: ~21 s of the mask matrix's JAX part); "
    "tests/ops/test_topk_attention.py runs the top-k op on JAX"
    for name in (
        "MultiHeadLatentAttention",
        "MultiHeadLatentAttention[indexer]",
    )
}


def _case_id(name, combo, mode):
    keras_masks, explicit, attention, causal = combo
    parts = [name, "keras=" + "".join("1" if k else "0" for k in keras_masks)]
    parts += ["explicit" if explicit else "no_explicit"]
    parts += ["attention_mask" if attention else "no_attention_mask"]
    parts += ["causal" if causal else "not_causal", mode]
    return "-".join(parts)


# The functional and tf_function modes test how masks travel through a
# graph: a Keras mask attached inside a model, beside or under an
# explicit mask. Their fast-tier cases are the combinations where every
# sequence input carries a Keras mask (the explicit masks on and off,
# with every attention-mask and causal choice); the others, whose masks
# are only arguments (the eager mode runs every one), join the slow tier
# (SLOW=1): the CI's 25-minute budget (2026-12-06, TF part 966 s).
GRAPH_SAMPLE = (
    "graph modes: the combinations without a Keras mask on every input "
    "run eagerly in the fast tier, in every mode with SLOW=1"
)


def _graph_sampled(combo, mode):
    return mode != "eager" and not all(combo[0])


def _params():
    for name, combos in MATRIX.items():
        for combo in combos:
            for mode in MODES:
                marks = [TF_FUNCTION] if mode == "tf_function" else []
                if _graph_sampled(combo, mode):
                    marks.append(pytest.mark.slow(GRAPH_SAMPLE))
                if name in SLOW_ON_JAX:
                    marks.append(pytest.mark.slow_on_jax(SLOW_ON_JAX[name]))
                reason = XFAIL.get((name,) + combo + (mode,))
                if reason:
                    marks.append(pytest.mark.xfail(strict=True, reason=reason))
                yield pytest.param(
                    name,
                    combo,
                    mode,
                    marks=marks,
                    id=_case_id(name, combo, mode),
                )


@pytest.fixture(scope="module")
def built_layers():
    """Each layer (and causal variant) built once for the module."""
    keras.utils.set_random_seed(7)
    cache = {}

    def get(name, causal):
        spec = SPECS[name]
        key = (name, causal if spec["causal"] == "init" else None)
        if key not in cache:
            layer = spec["make"](causal if spec["causal"] == "init" else None)
            xs = [x for x, _ in spec["inputs"]]
            layer(*xs)  # build
            _randomize_biases(layer)
            cache[key] = layer
        return cache[key]

    return get


@pytest.fixture(scope="module")
def references_of(built_layers):
    """The NumPy reference of a case, computed once per (layer,
    combination) for the module and shared by its call modes: it depends
    on the layer's weights (built once above, never trained) and on the
    masks, not on the mode."""
    cache = {}

    def get(name, combo, valid, attn):
        if (name, combo) not in cache:
            spec = SPECS[name]
            causal = combo[3]
            layer = built_layers(name, causal)
            xs = [x for x, _ in spec["inputs"]]
            cache[name, combo] = spec["reference"](
                layer, xs, valid, attn, causal
            )
        return cache[name, combo]

    return get


def _randomize_biases(layer):
    """Non-zero biases, so that a padded query's output (the bias) and a
    padded key's projection differ from zero."""
    rng = np.random.default_rng(11)
    for w in layer.weights:
        if "bias" in w.path or "beta" in w.path:
            w.assign(rng.normal(size=w.shape).astype(w.dtype) * 0.3)


def _call(spec, layer, xs, keras_valid, kwargs, causal, return_inputs=False):
    """Calls `layer` on `xs`, attaching the Keras masks, in the current mode
    (the tensors may be eager, traced or symbolic)."""
    tensors = [
        WithKerasMask()([x, m]) if m is not None else x
        for x, m in zip(xs, keras_valid)
    ]
    if spec["causal"] == "call" and causal:
        kwargs = dict(kwargs, use_causal_mask=True)
    out = layer(*tensors, **kwargs)
    out = out[0] if isinstance(out, (tuple, list)) else out
    return (out, tensors) if return_inputs else out


def _run(mode, spec, layer, xs, keras_valid, kwargs, causal):
    """Returns a function of (xs, keras masks, kwargs arrays) -> NumPy
    output, prepared for `mode` (traced / model built once per case)."""
    names = sorted(kwargs)
    if mode == "eager":

        def run(xs, keras_valid, kwargs):
            return np_(_call(spec, layer, xs, keras_valid, kwargs, causal))

        return run
    if mode == "tf_function":
        import tensorflow as tf

        @tf.function
        def traced(xs, keras_valid, kwargs):
            return _call(spec, layer, xs, keras_valid, kwargs, causal)

        def run(xs, keras_valid, kwargs):
            return np_(traced(list(xs), list(keras_valid), dict(kwargs)))

        return run
    # Functional: every array a keras.Input (masks attached in the model).
    x_in = [keras.Input(x.shape[1:], dtype="float32") for x in xs]
    m_in = [
        None if m is None else keras.Input(m.shape[1:], dtype="bool")
        for m in keras_valid
    ]
    k_in = {k: keras.Input(kwargs[k].shape[1:], dtype="bool") for k in names}
    out = _call(spec, layer, x_in, m_in, k_in, causal)
    flat_inputs = (
        x_in + [m for m in m_in if m is not None] + [k_in[k] for k in names]
    )
    model = keras.Model(flat_inputs, out)

    def run(xs, keras_valid, kwargs):
        arrays = list(xs) + [m for m in keras_valid if m is not None]
        return np_(model(arrays + [kwargs[k] for k in names]))

    return run


@pytest.mark.parametrize("name,combo,mode", list(_params()))
def test_mask_matrix(built_layers, references_of, name, combo, mode):
    keras_on, explicit, attention, causal = combo
    spec = SPECS[name]
    layer = built_layers(name, causal)
    xs = [x for x, _ in spec["inputs"]]
    keras_valid = [
        KERAS_PADDING[x.shape[1]] if on else None for x, on in zip(xs, keras_on)
    ]
    kwargs = {}
    if explicit:
        kwargs.update(
            {arg: EXPLICIT_PADDING[x.shape[1]] for x, arg in spec["inputs"]}
        )
    if attention:
        kwargs.update(
            {k: ATTENTION_MASKS[tk] for k, tk in spec["attention"].items()}
        )
    # What the layer should apply: the explicit mask, else the Keras mask.
    valid = [
        EXPLICIT_PADDING[x.shape[1]]
        if explicit
        else (kv if kv is not None else np.ones(x.shape[:2], bool))
        for x, kv in zip(xs, keras_valid)
    ]
    attn = {k: kwargs[k] for k in spec["attention"] if k in kwargs}

    run = _run(mode, spec, layer, xs, keras_valid, kwargs, causal)
    out = run(xs, keras_valid, kwargs)
    expected = references_of(name, combo, valid, attn)
    rows = Ellipsis if spec["core"] else valid[0]
    assert np.all(np.isfinite(out)), "non-finite output"
    np.testing.assert_allclose(out[rows], expected[rows], atol=1e-4, rtol=1e-4)

    # Values at padded positions do not reach valid outputs.
    noisy = []
    for x, v in zip(xs, valid):
        x = x.copy()
        x[~v] = RNG.normal(size=x[~v].shape) * 10
        noisy.append(x)
    rows = valid[0] if out.ndim == 3 else Ellipsis
    np.testing.assert_allclose(
        run(noisy, keras_valid, kwargs)[rows], out[rows], atol=1e-4, rtol=1e-4
    )
    if mode == "eager" and keras_on[0] and out.ndim == 3:
        _check_keras_mask_flow(spec, layer, xs, keras_valid, kwargs, causal)


def _check_keras_mask_flow(spec, layer, xs, keras_valid, kwargs, causal):
    """The output carries the first input's Keras mask (the explicit `mask`
    when one is given), and no input loses its Keras mask."""
    out, tensors = _call(spec, layer, xs, keras_valid, kwargs, causal, True)
    want = kwargs.get("mask", keras_valid[0])
    np.testing.assert_array_equal(np_(get_keras_mask(out)), want)
    for t, m in zip(tensors, keras_valid):
        if m is not None:
            np.testing.assert_array_equal(np_(get_keras_mask(t)), m)


def test_matrix_size(capsys):
    """Every masked layer is in the matrix; prints its size."""
    assert set(SPECS) == {
        "MultiHeadAttention",
        "MultiHeadAttention[qk_norm,learned_sinks]",
        "MultiHeadAttention[use_gate,sliding_window]",
        "SelfAttention",
        "CausalSelfAttention",
        "CrossAttention",
        "LocalSelfAttention",
        "AttentionPooling",
        "BahdanauAttention",
        "LuongAttention[global]",
        "LuongAttention[local-m]",
        "LuongAttention[local-p]",
        "AttentionRNNDecoder",
        "MultiHeadAttention[mask_mod=KerasSlidingWindowMask]",
        "SelfAttention[mask_mod=ChunkedCausalMask]",
        "CausalSelfAttention[mask_mod=DocumentMask]",
        "LocalSelfAttention[mask_mod=PrefixLMMask]",
        "TransformerEncoderBlock",
        "TransformerDecoderBlock",
        "KimiDeltaAttention",
        "MultiHeadLatentAttention",
        "MultiHeadLatentAttention[indexer]",
    }
    modes = len(MODES) if BACKEND == "tensorflow" else 2
    with capsys.disabled():
        print(
            f"\nmask matrix: {len(SPECS)} layers, {NUM_COMBINATIONS} "
            f"combinations, x {modes} call modes = {NUM_COMBINATIONS * modes} "
            "cases"
        )
    assert NUM_COMBINATIONS == sum(len(c) for c in MATRIX.values()) > 0
