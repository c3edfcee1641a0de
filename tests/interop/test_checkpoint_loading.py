"""`from_huggingface`'s reader and refusals on small random checkpoints
written here with `safetensors.numpy` (no transformers, no downloads):
single files and shards, bfloat16 kept or cast by `dtype=`, tensors
written into the weights chunk by chunk (the same weights; a chunk held,
not a tensor: `tracemalloc`), a missing, misshapen or unread tensor
named, pickled checkpoints refused, unknown model types, RoPE types and
options refused by name, the two config layouts of the rotary settings,
`hf://` through a stand-in `snapshot_download`. Backend-neutral (cheap:
every backend runs it)."""

import json
import sys
import tracemalloc

import keras
import ml_dtypes
import numpy as np
import pytest
from keras import ops
from keras.ops import convert_to_numpy as to_numpy

import keras_attention
from keras_attention.interop import huggingface
from keras_attention.interop.checkpoint import Checkpoint
from keras_attention.interop.hf import configs
from keras_attention.interop.hf import weights

safetensors_numpy = pytest.importorskip("safetensors.numpy")

LLAMA = dict(
    model_type="llama",
    vocab_size=12,
    hidden_size=8,
    intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    max_position_embeddings=32,
)


def random_tensors(config, dtype="float32", seed=0):
    """Random tensors of the names and shapes the family's converter
    expects for `config`."""
    hf_config = configs.HFConfig(config)
    conversion = huggingface.MODEL_TYPES[config["model_type"]](
        hf_config, "float32"
    )
    shapes = weights.expected_shapes(
        conversion.model, conversion.table, conversion.num_layers
    )
    rng = np.random.default_rng(seed)
    return {
        name: rng.normal(size=shape).astype(np.dtype(dtype))
        for name, shape in sorted(shapes.items())
    }


def write(directory, config, tensors, shards=1):
    """`config.json` and the tensors, in one file or `shards` shards with
    their index."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    if shards == 1:
        safetensors_numpy.save_file(
            tensors, str(directory / "model.safetensors")
        )
        return directory
    names = sorted(tensors)
    weight_map = {}
    for k in range(shards):
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: tensors[name] for name in names[k::shards]}
        safetensors_numpy.save_file(part, str(directory / file))
        weight_map.update({name: file for name in part})
    index = {"metadata": {}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory


def weight(model, path):
    return next(w for w in model.weights if w.path == path)


def test_single_file_and_shards_load_the_same(tmp_path):
    tensors = random_tensors(LLAMA)
    one = keras_attention.interop.from_huggingface(
        write(tmp_path / "one", LLAMA, tensors)
    )
    three = keras_attention.interop.from_huggingface(
        write(tmp_path / "three", LLAMA, tensors, shards=3)
    )
    for a, b in zip(one.weights, three.weights):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    # The transforms: a torch Linear weight transposed into the heads.
    q = tensors["model.layers.1.self_attn.q_proj.weight"]
    ours = weight(one, "transformer_layer_1/self_attention/query/kernel")
    np.testing.assert_array_equal(to_numpy(ours), q.T.reshape(8, 2, 4))
    head = weight(one, "token_embedding/reverse_embeddings")
    np.testing.assert_array_equal(to_numpy(head), tensors["lm_head.weight"].T)


def test_the_reader_reads_each_tensor(tmp_path):
    tensors = random_tensors(LLAMA)
    checkpoint = Checkpoint(write(tmp_path, LLAMA, tensors, shards=2))
    assert sorted(checkpoint.names()) == sorted(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(checkpoint.read(name), value)
    assert checkpoint.nbytes() == sum(v.nbytes for v in tensors.values())


def test_bfloat16_stays_bfloat16(tmp_path):
    tensors = random_tensors(LLAMA, dtype=ml_dtypes.bfloat16)
    model = keras_attention.interop.from_huggingface(
        write(tmp_path, LLAMA, tensors)
    )
    assert {w.dtype for w in model.weights} == {"bfloat16"}
    scale = weight(model, "sequence_output_layernorm/scale")
    np.testing.assert_array_equal(
        to_numpy(scale).astype("float32"),
        tensors["model.norm.weight"].astype("float32"),
    )


def test_dtype_casts_the_weights(tmp_path):
    tensors = random_tensors(LLAMA, dtype=ml_dtypes.bfloat16)
    model = keras_attention.interop.from_huggingface(
        write(tmp_path, LLAMA, tensors), dtype="float32"
    )
    assert {w.dtype for w in model.weights} == {"float32"}
    table = weight(model, "token_embedding/embeddings")
    np.testing.assert_array_equal(
        to_numpy(table),
        tensors["model.embed_tokens.weight"].astype("float32"),
    )
    with pytest.raises(ValueError, match="dtype='nonsense'"):
        keras_attention.interop.from_huggingface(tmp_path, dtype="nonsense")


def test_bfloat16_shards_stay_bfloat16_or_cast(tmp_path):
    """A sharded bfloat16 checkpoint (`model.safetensors.index.json`):
    `dtype=None` keeps bfloat16, `dtype="float32"` casts, every weight
    the checkpoint's value (transposed where torch's layout differs)."""
    tensors = random_tensors(LLAMA, dtype=ml_dtypes.bfloat16)
    directory = write(tmp_path, LLAMA, tensors, shards=3)
    assert (directory / "model.safetensors.index.json").is_file()
    q = tensors["model.layers.0.self_attn.q_proj.weight"]
    for dtype, want in ((None, "bfloat16"), ("float32", "float32")):
        model = keras_attention.interop.from_huggingface(directory, dtype)
        assert {w.dtype for w in model.weights} == {want}
        ours = weight(model, "transformer_layer_0/self_attention/query/kernel")
        np.testing.assert_array_equal(
            to_numpy(ops.cast(ours, "float32")),
            q.astype("float32").T.reshape(8, 2, 4),
        )


def test_chunks_of_one_row_give_the_same_weights(tmp_path, monkeypatch):
    """Every transform written in pieces (one output index a piece:
    heads of a projection, columns of the head, rows of a bias) equals
    the whole tensor's transform."""
    config = dict(LLAMA, attention_bias=True)
    tensors = random_tensors(config)
    directory = write(tmp_path, config, tensors)
    whole = keras_attention.interop.from_huggingface(directory)
    monkeypatch.setattr(weights, "CHUNK_BYTES", 1)
    pieces = keras_attention.interop.from_huggingface(directory)
    for a, b in zip(whole.weights, pieces.weights):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    o = tensors["model.layers.1.self_attn.o_proj.weight"]  # (8, 2 * 4)
    path = "transformer_layer_1/self_attention/attention_output/kernel"
    ours = weight(pieces, path)
    np.testing.assert_array_equal(to_numpy(ours), o.T.reshape(2, 4, 8))
    bias = tensors["model.layers.1.self_attn.q_proj.bias"]
    ours = weight(pieces, "transformer_layer_1/self_attention/query/bias")
    np.testing.assert_array_equal(to_numpy(ours), bias.reshape(2, 4))


def test_loading_holds_a_chunk_not_a_whole_tensor(tmp_path, monkeypatch):
    """Issue 55's loading memory: each tensor is written into its weight
    chunk by chunk, in place, so the NumPy side of loading (what
    `tracemalloc` sees) holds a few chunks, never a whole tensor (the
    token table and the head here, 512 KiB each)."""
    config = dict(LLAMA, vocab_size=2048, hidden_size=64)
    tensors = random_tensors(config)
    checkpoint = Checkpoint(write(tmp_path, config, tensors))
    conversion = huggingface.MODEL_TYPES["llama"](
        configs.HFConfig(config), "float32"
    )
    arguments = (conversion.table, conversion.num_layers, conversion.ignored)
    monkeypatch.setattr(weights, "CHUNK_BYTES", 2**14)
    # Once first: JAX compiles its slice writers for these shapes.
    weights.load_weights(conversion.model, checkpoint, *arguments)
    for w in conversion.model.weights:
        w.assign(ops.zeros(w.shape, w.dtype))
    tracemalloc.start()
    try:
        weights.load_weights(conversion.model, checkpoint, *arguments)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    largest = max(v.nbytes for v in tensors.values())
    assert largest == 2048 * 64 * 4
    assert peak < largest / 2, (peak, largest)
    head = weight(conversion.model, "token_embedding/reverse_embeddings")
    np.testing.assert_array_equal(to_numpy(head), tensors["lm_head.weight"].T)


def test_a_missing_tensor_is_named(tmp_path):
    tensors = random_tensors(LLAMA)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj"):
        keras_attention.interop.from_huggingface(
            write(tmp_path, LLAMA, tensors)
        )


def test_a_misshapen_tensor_is_named_with_both_shapes(tmp_path):
    tensors = random_tensors(LLAMA)
    tensors["model.layers.0.self_attn.k_proj.weight"] = np.zeros(
        (8, 8), "float32"
    )
    with pytest.raises(ValueError) as error:
        keras_attention.interop.from_huggingface(
            write(tmp_path, LLAMA, tensors)
        )
    message = str(error.value)
    assert "model.layers.0.self_attn.k_proj.weight" in message
    assert "(8, 8)" in message and "(4, 8)" in message


def test_an_unread_tensor_is_refused(tmp_path):
    tensors = random_tensors(LLAMA)
    tensors["model.layers.0.self_attn.q_norm.weight"] = np.ones(4, "float32")
    with pytest.raises(ValueError, match="q_norm"):
        keras_attention.interop.from_huggingface(
            write(tmp_path, LLAMA, tensors)
        )


def test_a_pickled_checkpoint_is_never_loaded(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(ValueError, match="pytorch_model.bin.*safetensors"):
        keras_attention.interop.from_huggingface(tmp_path)


def test_an_unknown_model_type_lists_the_supported_ones(tmp_path):
    config = dict(LLAMA, model_type="xlnet")
    write(tmp_path, config, random_tensors(LLAMA))
    with pytest.raises(ValueError, match="'xlnet'") as error:
        keras_attention.interop.from_huggingface(tmp_path)
    for model_type in keras_attention.interop.supported_model_types():
        assert model_type in str(error.value)


@pytest.mark.parametrize(
    "option, match",
    [
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "dynamic"),
        (
            {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "x": 1}},
            r"\['x'\]",
        ),
        ({"hidden_act": "gelu_fast"}, "hidden_act='gelu_fast'"),
    ],
)
def test_an_unsupported_option_is_refused_by_name(tmp_path, option, match):
    write(tmp_path, dict(LLAMA, **option), random_tensors(LLAMA))
    with pytest.raises(ValueError, match=match):
        keras_attention.interop.from_huggingface(tmp_path)


def test_both_rope_layouts_read_the_same():
    old = configs.HFConfig(
        dict(
            LLAMA,
            rope_theta=5e5,
            rope_scaling={
                "type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        )
    )
    new = dict(LLAMA, rope_parameters=dict(old.values["rope_scaling"]))
    new["rope_parameters"]["rope_theta"] = 5e5
    del new["rope_theta"]
    want = configs.rope_arguments(old)
    assert want == configs.rope_arguments(configs.HFConfig(new))
    assert want["rotary_max_wavelength"] == 5e5
    assert want["rotary_scaling"]["rope_type"] == "llama3"
    nested = configs.HFConfig(
        dict(
            LLAMA,
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                "sliding_attention": {
                    "rope_type": "default",
                    "rope_theta": 1e4,
                },
            },
        )
    )
    assert configs.rope_arguments(nested, "sliding_attention") == {
        "rotary_max_wavelength": 1e4,
        "rotary_scaling": None,
        "rotary_fraction": 1.0,
    }


def test_hub_ids_download_config_and_safetensors_only(tmp_path, monkeypatch):
    write(tmp_path, LLAMA, random_tensors(LLAMA))
    calls = []

    def snapshot_download(repo_id, allow_patterns):
        calls.append((repo_id, allow_patterns))
        return str(tmp_path)

    hub = type(sys)("huggingface_hub")
    hub.snapshot_download = snapshot_download
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    model = keras_attention.interop.from_huggingface("hf://org/tiny-llama")
    assert len(model.weights) == 21
    ((repo_id, patterns),) = calls
    assert repo_id == "org/tiny-llama"
    assert "config.json" in patterns
    assert not any(p.endswith(".bin") or p == "*" for p in patterns)
    with pytest.raises(ValueError, match="hf://<organization>/<name>"):
        keras_attention.interop.from_huggingface("hf://no-organization")
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ImportError, match=r"\[huggingface\]"):
        keras_attention.interop.from_huggingface("hf://org/tiny-llama")


def test_supported_model_types_is_the_registry():
    assert keras_attention.interop.supported_model_types() == sorted(
        huggingface.MODEL_TYPES
    )


class _CountingInitializer(keras.initializers.Initializer):
    """Normal draws, counted."""

    calls = 0

    def __call__(self, shape, dtype=None):
        _CountingInitializer.calls += 1
        return keras.random.normal(shape, dtype=dtype, seed=1)


def test_the_model_is_built_without_drawing_initializers(tmp_path, monkeypatch):
    """Issue 55's loading memory on JAX: `from_huggingface` builds the
    model inside `ops.zeros_for_initializers()`, where no initializer
    is drawn (a random bfloat16 draw holds a float32 draw beside the
    weight) and the weights start as zeros; the layers work as usual
    after it, and an initializer still runs outside it. Elsewhere the
    context builds as usual (the draws there are freed one by one)."""
    _CountingInitializer.calls = 0
    with keras_attention.ops.zeros_for_initializers():
        layer = keras.layers.Dense(3, kernel_initializer=_CountingInitializer())
        layer.build((None, 4))
    drawn = _CountingInitializer.calls
    out = to_numpy(layer(np.ones((2, 4), "float32")))
    if keras.backend.backend() == "jax":
        assert drawn == 0
        np.testing.assert_array_equal(to_numpy(layer.kernel), 0.0)
        np.testing.assert_array_equal(out, 0.0)
    else:
        assert drawn == 1
    layer.kernel.assign(np.ones((4, 3), "float32"))
    np.testing.assert_allclose(to_numpy(layer(np.ones((1, 4)))), [[4.0] * 3])
    outside = keras.layers.Dense(3, kernel_initializer=_CountingInitializer())
    outside.build((None, 4))
    assert _CountingInitializer.calls == drawn + 1
    # `from_huggingface` builds inside it, and loads every weight.
    calls = []
    original = keras_attention.ops.zeros_for_initializers
    monkeypatch.setattr(
        keras_attention.ops,
        "zeros_for_initializers",
        lambda: calls.append(1) or original(),
    )
    tensors = random_tensors(LLAMA)
    model = keras_attention.interop.from_huggingface(
        write(tmp_path, LLAMA, tensors)
    )
    assert calls == [1]
    head = weight(model, "token_embedding/reverse_embeddings")
    np.testing.assert_array_equal(to_numpy(head), tensors["lm_head.weight"].T)
