import keras
import numpy as np
import pytest

from harness import run_layer_test, run_mask_test
from keras_attention.layers import MultiHeadAttention


def test_harness_mha():
    rng = np.random.default_rng(0)
    run_layer_test(
        MultiHeadAttention,
        dict(num_heads=2, key_dim=4),
        dict(query=rng.normal(size=(2, 5, 8)).astype("float32"),
             value=rng.normal(size=(2, 7, 6)).astype("float32")),
        call_kwargs=dict(return_attention_scores=True),
        expected_output_shape=((2, 5, 8), (2, 2, 5, 7)),
        expected_num_trainable_weights=8,
    )


def test_mask_mha():
    run_mask_test(MultiHeadAttention, dict(num_heads=2, key_dim=4),
                  ("query", "value"), ("query_mask", "value_mask"))


def test_mask_mha_causal():
    run_mask_test(MultiHeadAttention, dict(num_heads=2, key_dim=4),
                  ("query", "value"), ("query_mask", "value_mask"),
                  call_kwargs=dict(use_causal_mask=True), causal=True)
