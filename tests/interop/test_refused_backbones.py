"""The keras-hub families `from_keras_hub` refuses are listed once
(`interop.refused.REFUSED_BACKBONES`, with a reason each): the guide's
"Families not converted" table has exactly their rows, none of them is
also converted, and converting one raises a `ValueError` that gives its
reason."""

import keras_hub
import pytest
from pretrained_guide import guide_rows

from keras_attention.interop import convert
from keras_attention.interop import from_keras_hub
from keras_attention.interop.refused import REFUSED_BACKBONES

pytestmark = pytest.mark.tf_only("a registry and text checks")


def test_the_guide_lists_exactly_the_refused_families_and_reasons():
    rows = guide_rows("Families not converted")  # class | kind | reason
    assert {r[0].strip("`"): (r[1], r[2]) for r in rows} == REFUSED_BACKBONES


def test_a_refused_family_is_a_keras_hub_class_and_not_converted():
    supported = tuple(getattr(keras_hub.models, n) for n in convert.CONVERTERS)
    for name in REFUSED_BACKBONES:
        cls = getattr(keras_hub.models, name, None)
        assert isinstance(cls, type), name
        assert issubclass(cls, keras_hub.models.Backbone), name
        assert not issubclass(cls, supported), name


def test_converting_a_refused_family_gives_its_reason():
    cls = getattr(keras_hub.models, "XLNetBackbone")  # built by name
    backbone = cls(
        vocabulary_size=20,
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
    )
    kind, reason = REFUSED_BACKBONES["XLNetBackbone"]
    with pytest.raises(ValueError) as info:
        from_keras_hub(backbone)
    message = str(info.value)
    assert "XLNetBackbone" in message and kind in message
    assert reason in message
    assert "BertBackbone" in message  # the supported ones are listed too
