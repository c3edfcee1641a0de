"""`keras_attention.blocks` is the home of the transformer blocks; the
old names `keras_attention.layers.Transformer*Block` still resolve."""

import keras
import pytest

import keras_attention
from keras_attention import blocks
from keras_attention import layers
from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.blocks import TransformerEncoderBlock

NAMES = ("TransformerEncoderBlock", "TransformerDecoderBlock")


@pytest.mark.parametrize("name", NAMES)
def test_old_layers_names_are_the_blocks(name):
    assert getattr(layers, name) is getattr(blocks, name)
    assert name in dir(layers)
    assert name in blocks.__all__
    # Documented once, under `blocks`; `layers.__all__` lists its own.
    assert name not in layers.__all__


def test_from_import_of_old_names():
    from keras_attention.layers import TransformerDecoderBlock as Decoder
    from keras_attention.layers import TransformerEncoderBlock as Encoder

    assert Encoder is TransformerEncoderBlock
    assert Decoder is TransformerDecoderBlock


def test_unknown_layers_name_raises_attribute_error():
    with pytest.raises(AttributeError, match="TransformerBlock"):
        layers.TransformerBlock  # noqa: B018
    assert not hasattr(layers, "NoSuchLayer")


def test_blocks_are_siblings():
    """Neither block subclasses the other; both share one private base."""
    assert not issubclass(TransformerDecoderBlock, TransformerEncoderBlock)
    assert not issubclass(TransformerEncoderBlock, TransformerDecoderBlock)
    base = TransformerEncoderBlock.__bases__
    assert base == TransformerDecoderBlock.__bases__
    assert base[0].__module__ == "keras_attention.blocks._transformer_block"
    assert "blocks" in keras_attention.__all__


def test_registered_names_unchanged():
    for cls in (TransformerEncoderBlock, TransformerDecoderBlock):
        name = f"keras_attention>{cls.__name__}"
        assert keras.saving.get_registered_name(cls) == name
        assert keras.saving.get_registered_object(name) is cls


def test_decoder_config_has_no_causal_and_encoder_has():
    encoder = TransformerEncoderBlock(2, 8, causal=True)
    decoder = TransformerDecoderBlock(2, 8, cross_attention=False)
    assert encoder.get_config()["causal"] is True
    assert "causal" not in decoder.get_config()
    assert decoder.causal is True  # always, as before
    # The encoder alone has causal and the global-token (Longformer)
    # options; the decoder alone has cross_attention.
    encoder_only = {"causal", "global_projections", "max_global_tokens"}
    shared = set(encoder.get_config()) - encoder_only
    assert shared == set(decoder.get_config()) - {"cross_attention"}
