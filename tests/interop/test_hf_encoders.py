"""`from_huggingface`'s encoders (`bert`, `roberta`, `modernbert`) beyond
their equality to transformers (`test_from_huggingface.py`): the options
their converters do not implement are refused by name, and a task
model's checkpoint (`BertForMaskedLM`: the encoder's tensors under
`bert.`, its heads beside them) loads its encoder, the same as the base
model's checkpoint. Random safetensors written here, no transformers.
Fast tier: TensorFlow (`tiers.py`)."""

import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy
from test_checkpoint_loading import random_tensors
from test_checkpoint_loading import write
from tiers import family_tier

from keras_attention.interop import from_huggingface
from keras_attention.interop import huggingface
from keras_attention.interop.hf import configs

pytestmark = family_tier()

ENCODER = dict(
    vocab_size=12,
    hidden_size=8,
    intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    max_position_embeddings=16,
    pad_token_id=0,
)


@pytest.mark.parametrize(
    "model_type, option, value",
    [
        ("bert", "is_decoder", True),
        ("bert", "add_cross_attention", True),
        ("bert", "position_embedding_type", "relative_key"),
        ("roberta", "position_embedding_type", "relative_key_query"),
        ("bert", "hidden_act", "gelu_python"),
        ("modernbert", "hidden_activation", "gelu_python"),
        ("modernbert", "layer_types", ["full_attention", "chunked"]),
    ],
)
def test_an_unsupported_option_is_refused_by_name(model_type, option, value):
    config = configs.HFConfig(
        dict(ENCODER, model_type=model_type, **{option: value})
    )
    with pytest.raises(ValueError, match=option):
        huggingface.MODEL_TYPES[model_type](config, "float32")


def test_a_task_checkpoint_loads_its_encoder(tmp_path):
    """A `BertForMaskedLM` checkpoint (tensors `bert.*`, the pooler and
    the `cls.*` head beside them) gives the encoder of the same tensors
    stored as a `BertModel`'s."""
    base = dict(ENCODER, model_type="bert", architectures=["BertModel"])
    tensors = random_tensors(base)
    rng = np.random.default_rng(1)
    pooler = {
        "pooler.dense.weight": rng.normal(size=(8, 8)).astype("float32"),
        "pooler.dense.bias": rng.normal(size=(8,)).astype("float32"),
    }
    task = {"bert." + name: value for name, value in tensors.items()}
    task.update({"bert." + name: value for name, value in pooler.items()})
    task["cls.predictions.bias"] = rng.normal(size=(12,)).astype("float32")
    masked_lm = dict(base, architectures=["BertForMaskedLM"])
    inputs = {
        "token_ids": np.array([[3, 5, 7, 0]], "int32"),
        "padding_mask": np.array([[1, 1, 1, 0]], "int32"),
        "segment_ids": np.array([[0, 1, 1, 0]], "int32"),
    }
    outputs = [
        to_numpy(from_huggingface(write(tmp_path / name, config, t))(inputs))
        for name, config, t in (
            ("base", base, {**tensors, **pooler}),
            ("task", masked_lm, task),
        )
    ]
    np.testing.assert_array_equal(outputs[0], outputs[1])
    # The base model's checkpoint has no head to leave unread: a `cls.*`
    # tensor there is refused.
    write(
        tmp_path / "extra",
        base,
        {
            **tensors,
            **pooler,
            **{"cls.predictions.bias": task["cls.predictions.bias"]},
        },
    )
    with pytest.raises(ValueError, match="cls.predictions.bias"):
        from_huggingface(tmp_path / "extra")
