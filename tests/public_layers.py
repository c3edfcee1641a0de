"""The public layer classes, in one place, for the tests that must cover
each of them (graph rank, the Hypothesis properties, constructor
arguments): a layer added to `keras_attention.layers.__all__` or
`keras_attention.blocks.__all__` appears here, and each of those tests
fails until it has a case for it.

- `LAYERS`: the classes of `keras_attention.layers.__all__` (its
  functions, `gelu_approximate`, are not layers);
- `BLOCKS`: the classes of `keras_attention.blocks.__all__`;
- `BASE_CLASSES`: public base classes, extension points with no
  computation of their own, covered through their subclasses (name ->
  which ones), and `KVShare`, the channel of `SharedKVSelfAttention`
  layers, covered through them.
"""

from keras_attention import blocks
from keras_attention import layers


def _classes(module):
    return frozenset(
        name
        for name in module.__all__
        if isinstance(getattr(module, name), type)
    )


LAYERS = _classes(layers)
BLOCKS = _classes(blocks)
BASE_CLASSES = {
    "KVShare": ("SharedKVSelfAttention",),
    "Seq2SeqAttention": ("BahdanauAttention", "LuongAttention"),
    "TokenMixer": (
        "MultiHeadAttention",
        "LinearAttention",
        "GatedDeltaNet",
        "MultiHeadLatentAttention",
    ),
}


def missing(covered, among=LAYERS | BLOCKS):
    """The public classes of `among` that `covered` (names) lacks, base
    classes excepted where a subclass of theirs is covered; sorted."""
    covered = set(covered)
    for base, subclasses in BASE_CLASSES.items():
        if covered & set(subclasses):
            covered.add(base)
    return sorted(set(among) - covered)
