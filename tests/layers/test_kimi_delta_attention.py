"""`KimiDeltaAttention` (Kimi Linear's KDA mixer) and the gated delta
rule with a decay per key channel: the shared harness; transformers'
`KimiLinearDeltaAttention` with its weights copied (uncached with left
and right padding, and its own cached prefill and decoding steps, the
caches included); the op's chunked form, recurrent form and the NumPy
recurrence (`tests/gated_delta_reference.py`) with documents, padding,
an initial state and strong decays, float64 too; cached calls in pieces
against the uncached call with padding; packed documents; the implied
attention matrix; the config and `.keras` round trip; argument errors.
Random draws: `tests/properties/test_kimi_delta_rule_property.py`."""

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import gated_delta_reference as ref
import keras
import numpy as np
import pytest
from harness import float64_enabled
from harness import run_layer_test
from harness import run_mask_test
from keras import ops

import keras_attention as ka
from keras_attention.layers import KimiDeltaAttention
from keras_attention.ops.gated_delta_rule import implied_attention
from keras_attention.visualization import collect_attention

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(56)
CONFIG = dict(hidden_size=8, num_heads=2, head_dim=4, conv_kernel_size=3)
T = 9
X = RNG.normal(size=(2, T, 8)).astype("float32")
# Row 0 left-padded, row 1 right-padded (a prompt buffer).
MASK = np.array([[False] * 3 + [True] * 6, [True] * 5 + [False] * 4])


def np_(x):
    return np.asarray(ops.convert_to_numpy(ops.cast(x, "float32")))


def _layer(chunk_size=3, dtype=None):
    layer = KimiDeltaAttention(**CONFIG, chunk_size=chunk_size, dtype=dtype)
    layer.build((None, None, X.shape[-1]))
    rng = np.random.default_rng(1)
    # Non-trivial norm scale, decays and biases (ones and zeros hide
    # mistakes).
    layer.set_weights(
        [
            (0.6 * rng.normal(size=w.shape)).astype("float32")
            for w in layer.weights
        ]
    )
    return layer


# --- transformers' KimiLinearDeltaAttention ----------------------------------

# Runs in a subprocess: importing transformers pulls triton, which crashes
# beside TensorFlow in one process. One subprocess per module (fixture).
_REFERENCE_SCRIPT = r"""
import json, sys
import numpy as np
import torch
from transformers import KimiLinearConfig
from transformers.cache_utils import DynamicCache
from transformers.models.kimi_linear import modeling_kimi_linear as m

case = json.loads(sys.argv[1])
data = np.load(sys.argv[2])
x, mask = torch.from_numpy(data["x"]), torch.from_numpy(data["mask"])
config = KimiLinearConfig(
    hidden_size=x.shape[-1],
    linear_num_heads=case["num_heads"],
    linear_head_dim=case["head_dim"],
    linear_conv_kernel_dim=case["conv_kernel_size"],
    rms_norm_eps=case["epsilon"],
    num_hidden_layers=1,
    layer_types=["linear_attention"],
    mlp_layer_types=["dense"],
)
torch.manual_seed(0)
layer = m.KimiLinearDeltaAttention(config, layer_idx=0).float().eval()
with torch.no_grad():
    for name, p in layer.named_parameters():
        p.copy_(torch.randn_like(p) * 0.5)
out = {}
with torch.no_grad():
    out["padded"] = layer(x, attention_mask=mask.float()).numpy()
    # Its cached path: a prefill of `prefill` tokens, then one by one.
    cache = DynamicCache(config=config)
    pieces = [layer(x[:, : case["prefill"]], cache=cache)]
    for t in range(case["prefill"], x.shape[1]):
        pieces.append(layer(x[:, t : t + 1], cache=cache))
    out["cached"] = torch.cat(pieces, 1).numpy()
    out["conv_state"] = cache.get_conv_state(0).numpy()
    out["state"] = cache.get_recurrent_state(0).numpy()
for name, p in layer.named_parameters():
    out[name] = p.detach().numpy()
np.savez(sys.argv[3], **out)
"""

CASE = dict(CONFIG, epsilon=1e-5, prefill=4)


@pytest.fixture(scope="module")
def transformers_outputs(request):
    """transformers' weights and outputs, from the subprocess; kept in
    pytest's cache under a digest of the script, the case, the inputs
    and the transformers version, so that the suite's three backend
    parts start it once (~15 s on the 2-core machine)."""
    if importlib.util.find_spec("transformers") is None:
        pytest.skip(
            "transformers is not installed (the `test` extra): the "
            "KimiLinearDeltaAttention reference is unavailable"
        )
    digest = hashlib.sha256(
        (_REFERENCE_SCRIPT + json.dumps(CASE)).encode()
        + importlib.metadata.version("transformers").encode()
        + X.tobytes()
        + MASK.tobytes()
    ).hexdigest()[:16]
    folder = request.config.cache.mkdir("kimi_delta_attention")
    path = folder / f"transformers-{digest}.npz"
    if not path.exists():
        env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
        env["OMP_NUM_THREADS"] = "1"
        with tempfile.TemporaryDirectory() as tmp:
            x_path = os.path.join(tmp, "x.npz")
            out_path = os.path.join(tmp, "out.npz")
            np.savez(x_path, x=X, mask=MASK)
            subprocess.run(
                [
                    sys.executable,
                    "-c",
                    _REFERENCE_SCRIPT,
                    json.dumps(CASE),
                    x_path,
                    out_path,
                ],
                check=True,
                env=env,
                timeout=300,
            )
            os.replace(out_path, path)  # whole, or not at all
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _from_transformers(weights, chunk_size):
    """Our layer with transformers' weights (`weights` by its names)."""
    layer = KimiDeltaAttention(
        **CONFIG, layer_norm_epsilon=CASE["epsilon"], chunk_size=chunk_size
    )
    layer.build((None, None, 8))
    for name in ("q_proj", "k_proj", "v_proj", "b_proj", "g_a_proj"):
        getattr(layer, name).kernel.assign(weights[f"{name}.weight"].T)
    for name in ("g_b_proj", "o_proj"):
        getattr(layer, name).kernel.assign(weights[f"{name}.weight"].T)
    for name in ("f_a_proj", "f_b_proj"):
        kernel = weights[f"forget_gate.{name}.weight"].T
        getattr(layer, name).kernel.assign(kernel)
    layer.conv1d_weight.assign(weights["conv1d.weight"][:, 0])
    layer.dt_bias.assign(weights["forget_gate.dt_bias"])
    layer.A_log.assign(weights["forget_gate.A_log"].reshape(-1))
    layer.o_norm.scale.assign(weights["o_norm.weight"])
    return layer


@pytest.mark.parametrize("chunk_size", [4, 32])
def test_equals_transformers_with_its_weights(transformers_outputs, chunk_size):
    # One chunk, and chunks that do not divide the length: the same
    # outputs at the real tokens of a left- and a right-padded row
    # (transformers zeroes padded inputs; ours takes them out).
    layer = _from_transformers(transformers_outputs, chunk_size)
    got = np_(layer(X, mask=MASK))
    want = transformers_outputs["padded"]
    np.testing.assert_allclose(got[MASK], want[MASK], rtol=1e-5, atol=2e-6)
    assert np.all(got[~MASK] == 0.0)


def test_cached_decoding_equals_transformers_cache(transformers_outputs):
    layer = _from_transformers(transformers_outputs, chunk_size=3)
    prefill = CASE["prefill"]
    cache = layer.init_cache(2)
    out, cache = layer(X[:, :prefill], cache=cache)
    pieces = [np_(out)]
    for t in range(prefill, T):
        out, cache = layer(X[:, t : t + 1], cache=cache, cache_update_index=t)
        pieces.append(np_(out))
    want = transformers_outputs["cached"]
    np.testing.assert_allclose(
        np.concatenate(pieces, 1), want, rtol=1e-5, atol=2e-6
    )
    # The caches hold the same: the convolution's last inputs (ours `(b,
    # K - 1, channels)`, transformers' `(b, channels, K)`) and the state.
    conv, state = (np_(c) for c in cache)
    k = CONFIG["conv_kernel_size"]
    np.testing.assert_allclose(
        conv,
        np.swapaxes(transformers_outputs["conv_state"], 1, 2)[:, 1 - k :],
        rtol=1e-6,
        atol=1e-6,
    )
    np.testing.assert_allclose(
        state, transformers_outputs["state"], rtol=1e-5, atol=2e-6
    )


# --- The shared harness ------------------------------------------------------


@pytest.mark.slow_on_jax(
    "31 s of JAX compilations (fit, export, mixed precision)"
)
def test_harness():
    run_layer_test(
        KimiDeltaAttention,
        dict(CONFIG, chunk_size=4),
        dict(inputs=X),
        expected_output_shape=X.shape,
        # conv1d_kernel, dt_bias, A_log and 10 sublayers of one weight.
        expected_num_trainable_weights=13,
        run_saved_model=False,  # test_saved_model (slow tier)
    )


@pytest.mark.tf_only("the export is the TensorFlow part's check")
@pytest.mark.slow(
    "the SavedModel export in a fresh process (~6 s); the fast tier runs "
    "every other harness check (`.keras` included), and GatedDeltaNet's "
    "export covers the same kernels' per-head form"
)
def test_saved_model():
    run_layer_test(
        KimiDeltaAttention,
        dict(CONFIG, chunk_size=4),
        dict(inputs=X),
        run_fit=False,
        run_mixed_precision=False,
    )


def test_masks():
    run_mask_test(
        KimiDeltaAttention,
        dict(CONFIG, chunk_size=4),
        ("inputs",),
        ("mask",),
        causal=True,
    )


# --- The op with a decay per key channel -------------------------------------

B, HK, HV, D, E = 2, 1, 2, 3, 2


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _rule_inputs(seed=0, dtype="float32"):
    rng = np.random.default_rng(seed)
    q = _unit(rng.normal(size=(B, T, HK, D)))
    k = _unit(rng.normal(size=(B, T, HK, D)))
    v = rng.normal(size=(B, T, HV, E))
    g = np.log(rng.uniform(0.05, 1.0, size=(B, T, HV, D)))
    g[0, 2, 1, 0] = -1e4  # a channel forgets at once, the others not
    g[1, 4:, 0, 2] = -40.0  # exp(-40 * 5) underflows float32
    beta = rng.uniform(size=(B, T, HV))
    state = rng.normal(size=(B, HV, D, E))
    return [x.astype(dtype) for x in (q, k, v, g, beta, state)]


SEGMENTS = np.array([[0, 0, 0, 0, 1, 1, 1, 1, 1], [0] * 4 + [2] * 5])
PADDING = np.array([[1, 1, 0, 1, 1, 1, 0, 1, 1], [1] * 7 + [0] * 2], bool)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_chunked_recurrent_and_numpy_agree(dtype):
    # Documents, padding inside rows and at their end, an initial state,
    # decays from none to -1e4: the chunked form at chunk sizes dividing
    # the length or not, the recurrent form and the NumPy recurrence.
    q, k, v, g, beta, state = _rule_inputs(dtype=dtype)
    want, want_state = ref.gated_delta_rule(
        q, k, v, g, beta, state, SEGMENTS, PADDING
    )
    tolerance = 1e-5 if dtype == "float32" else 1e-12
    for chunk_size in (None, 1, 2, 4, 16):
        with float64_enabled():
            out, final = ka.ops.gated_delta_rule(
                q,
                k,
                v,
                g,
                beta,
                chunk_size=chunk_size,
                initial_state=state,
                return_state=True,
                segment_ids=SEGMENTS,
                key_mask=PADDING,
            )
            assert keras.backend.standardize_dtype(out.dtype) == dtype
            out, final = (ops.convert_to_numpy(x) for x in (out, final))
        assert np.all(np.isfinite(out)) and np.all(np.isfinite(final))
        np.testing.assert_allclose(out, want, rtol=tolerance, atol=tolerance)
        np.testing.assert_allclose(
            final, want_state, rtol=tolerance, atol=tolerance
        )
        assert np.all(out[~PADDING] == 0.0)


def _gradients(chunk_size, args, cotangent):
    """Gradients of `sum(out * cotangent) + sum(state)` w.r.t. `args` (q,
    k, v, g, beta, initial state)."""

    def loss(*a):
        out, state = ka.ops.gated_delta_rule(
            *a[:5],
            chunk_size=chunk_size,
            initial_state=a[5],
            return_state=True,
            segment_ids=SEGMENTS,
            key_mask=PADDING,
        )
        return ops.sum(out * cotangent) + ops.sum(state)

    if BACKEND == "jax":
        import jax

        grad = jax.grad(loss, argnums=tuple(range(len(args))))
        return [np.asarray(g) for g in jax.jit(grad)(*args)]
    if BACKEND == "torch":
        import torch

        args = [ops.convert_to_tensor(a).requires_grad_(True) for a in args]
        return [np_(g) for g in torch.autograd.grad(loss(*args), args)]
    import tensorflow as tf

    args = [tf.Variable(a) for a in args]
    with tf.GradientTape() as tape:
        value = loss(*args)
    return [g.numpy() for g in tape.gradient(value, args)]


def test_gradients_are_finite_and_equal_in_both_forms():
    # Training runs the chunked form: its gradients are the recurrence's,
    # decays of -1e4 included (no NaN through the masked exponentials).
    args = _rule_inputs()
    cotangent = RNG.normal(size=args[2].shape).astype("float32")
    chunked = _gradients(4, args, ops.convert_to_tensor(cotangent))
    recurrent = _gradients(None, args, ops.convert_to_tensor(cotangent))
    for name, a, b in zip("q k v g beta state".split(), chunked, recurrent):
        assert np.all(np.isfinite(a)), name
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=name)
    for grad in chunked[:5]:  # padded tokens take no part
        assert np.all(grad[~PADDING] == 0.0)


def test_a_decay_equal_over_channels_is_the_per_head_rule():
    q, k, v, g, beta, state = _rule_inputs()
    per_head = g[..., 0]
    kwargs = dict(chunk_size=4, initial_state=state, return_state=True)
    channel = ka.ops.gated_delta_rule(
        q, k, v, np.repeat(per_head[..., None], D, -1), beta, **kwargs
    )
    head = ka.ops.gated_delta_rule(q, k, v, per_head, beta, **kwargs)
    for a, b in zip(channel, head):
        np.testing.assert_allclose(np_(a), np_(b), rtol=1e-5, atol=1e-6)


def test_implied_attention_is_the_rule_on_unit_values():
    q, k, _, g, beta, _ = _rule_inputs()
    weights = np_(implied_attention(q, k, g, beta, SEGMENTS, PADDING))
    want = ref.attention_matrix(q, k, g, beta, SEGMENTS, PADDING)
    np.testing.assert_allclose(weights, want, rtol=1e-5, atol=1e-6)


def test_a_decay_of_the_wrong_shape_is_refused():
    q, k, v, g, beta, _ = _rule_inputs()
    with pytest.raises(ValueError, match=r"`g` must have shape \(batch, T"):
        ka.ops.gated_delta_rule(q, k, v, g[..., :2], beta)


# --- Cached calls, padding, documents -----------------------------------------


@pytest.mark.slow_on_jax(
    "16 s of JAX compilations; other cases test the chunked rule on JAX"
)
def test_cached_pieces_with_padding_equal_the_uncached_call():
    # The state carried from call to call: pieces of 3, 1, 4 and 1
    # tokens, padded where the uncached call is, give its outputs at the
    # real tokens; padded steps leave the cache as it is.
    layer = _layer()
    whole = np_(layer(X, mask=MASK))
    cache = layer.init_cache(2)
    shapes = [tuple(c.shape) for c in cache]
    pieces, start = [], 0
    for size in (3, 1, 4, 1):
        stop = start + size
        out, cache = layer(
            X[:, start:stop],
            mask=MASK[:, start:stop],
            cache=cache,
            cache_update_index=start,
        )
        pieces.append(np_(out))
        assert [tuple(c.shape) for c in cache] == shapes  # constant size
        start = stop
    got = np.concatenate(pieces, 1)
    np.testing.assert_allclose(got[MASK], whole[MASK], rtol=1e-5, atol=1e-5)
    assert keras.backend.standardize_dtype(cache[1].dtype) == "float32"


def test_prefill_of_a_right_padded_buffer_continues_each_prompt():
    # Prompts of 5 and 9 tokens in a buffer of 9, then one more token for
    # row 0: its output is that of the prompt followed by the token, as
    # if the padding were not there (no convolution over it, no decay).
    layer = _layer()
    mask = np.array([[True] * 5 + [False] * 4, [True] * T])
    _, cache = layer(X, mask=mask, cache=layer.init_cache(2))
    token = RNG.normal(size=(2, 1, 8)).astype("float32")
    step, _ = layer(token, cache=cache, cache_update_index=5)
    longer = X.copy()
    longer[0, 5] = token[0, 0]
    mask[0, 5] = True
    want = np_(layer(longer, mask=mask))[0, 5]
    np.testing.assert_allclose(np_(step)[0, 0], want, rtol=1e-5, atol=1e-5)


def test_packed_documents_equal_documents_one_by_one():
    layer = _layer()
    packed = np_(layer(X, segment_ids=SEGMENTS))
    for row, spans in ((0, [(0, 4), (4, 9)]), (1, [(0, 4), (4, 9)])):
        masks = np.zeros((2, T), bool)
        for i, (a, b) in enumerate(spans):
            masks[i, a:b] = True
        alone = np_(layer(X[[row, row]], mask=masks))
        for i, (a, b) in enumerate(spans):
            np.testing.assert_allclose(
                packed[row, a:b], alone[i, a:b], rtol=1e-5, atol=1e-5
            )


def test_attention_matrix_and_collect_attention():
    layer = _layer()
    out, weights = layer(X, mask=MASK, return_attention_scores=True)
    weights = np_(weights)
    assert weights.shape == (2, 2, T, T)
    assert np.all(np.triu(weights, 1) == 0.0)
    np.testing.assert_allclose(np_(out), np_(layer(X, mask=MASK)), atol=1e-6)
    inputs = keras.Input((None, 8))
    model = keras.Model(inputs, layer(inputs))
    maps = collect_attention(model, X)
    (name,) = maps
    np.testing.assert_allclose(
        maps[name], np_(layer(X, return_attention_scores=True)[1]), atol=1e-6
    )
    with pytest.raises(ValueError, match=r"KimiDeltaAttention\) ran on 9"):
        collect_attention(model, X, max_dense_length=4)


# --- Config, errors and precision ---------------------------------------------


def test_config_round_trip():
    layer = _layer(chunk_size=5)
    config = layer.get_config()
    assert {k: config[k] for k in CONFIG} == CONFIG
    assert "linear_num_key_heads" not in config
    revived = KimiDeltaAttention.from_config(config)
    revived.build((None, None, 8))
    revived.set_weights(layer.get_weights())
    np.testing.assert_allclose(
        np_(revived(X, mask=MASK)), np_(layer(X, mask=MASK)), atol=1e-6
    )
    names = [w.path.split("/", 1)[1] for w in layer.weights]
    assert names[:3] == ["conv1d_kernel", "dt_bias", "A_log"]
    assert {"q_proj/kernel", "f_b_proj/kernel", "o_norm/scale"} <= set(names)


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(num_heads=0), "`num_heads` must be a positive integer"),
        (dict(head_dim=2.5), "`head_dim` must be a positive integer"),
        (dict(hidden_size=0), "`hidden_size` must be a positive integer"),
        (dict(conv_kernel_size=1.5), "`conv_kernel_size`"),
        (dict(hidden_activation="nope"), "`hidden_activation`"),
        (dict(layer_norm_epsilon=-1.0), "`layer_norm_epsilon`"),
        (dict(chunk_size=0), "`chunk_size` must be a positive integer"),
    ],
)
def test_bad_arguments_are_refused(change, match):
    with pytest.raises(ValueError, match=match):
        KimiDeltaAttention(**dict(CONFIG, **change))


def test_bad_calls_are_refused():
    layer = _layer()
    cache = layer.init_cache(2)
    assert [tuple(c.shape) for c in cache] == [(2, 2, 24), (2, 2, 4, 4)]
    with pytest.raises(ValueError, match=r"`cache\[1\]` must have shape"):
        layer(X, cache=(cache[0], cache[1][:, :1]))
    with pytest.raises(ValueError, match="cannot apply to a cached call"):
        layer(X, cache=cache, return_attention_scores=True)
    with pytest.raises(ValueError, match="`inputs` must have 8 features"):
        layer(X[..., :5])


def test_bfloat16_layer_keeps_a_float32_state():
    layer = _layer(dtype="mixed_bfloat16")
    conv, state = layer.init_cache(2)
    assert keras.backend.standardize_dtype(conv.dtype) == "bfloat16"
    out, (conv, state) = layer(X, mask=MASK, cache=(conv, state))
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(state.dtype) == "float32"
    full = _layer()
    _, (_, want) = full(X, mask=MASK, cache=full.init_cache(2))
    np.testing.assert_allclose(np_(state), np_(want), atol=0.1)


def test_float64_layer_stays_float64_in_pieces_and_whole():
    # Keras's torch `matmul` (a `Dense` without bias) computes float64 in
    # float32: the projections must not go through it.
    layer = _layer(dtype="float64")
    x = X.astype("float64")
    with float64_enabled():
        whole = layer(x, mask=MASK)
        cache = layer.init_cache(2)
        pieces = []
        for start, stop in ((0, 4), (4, 5), (5, T)):
            out, cache = layer(
                x[:, start:stop], mask=MASK[:, start:stop], cache=cache
            )
            pieces.append(ops.convert_to_numpy(out))
        dtypes = [whole.dtype, out.dtype, cache[0].dtype, cache[1].dtype]
        whole = ops.convert_to_numpy(whole)
    assert {keras.backend.standardize_dtype(d) for d in dtypes} == {"float64"}
    np.testing.assert_allclose(
        np.concatenate(pieces, 1)[MASK], whole[MASK], rtol=1e-12, atol=1e-12
    )
