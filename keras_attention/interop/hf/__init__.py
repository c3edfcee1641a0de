"""`from_huggingface`'s family converters: one module per architecture.

A family module reads a `config.json` (`configs.HFConfig`) into the
arguments of the builder that the keras-hub converter of the same
architecture uses (`interop.llama.llama_style_model`,
`interop.gemma.gemma_style_model`), and states which checkpoint tensor
fills which weight as a table (`weights`: rows `(their name, our path,
transform)`). Its converter, registered in
`interop.huggingface.MODEL_TYPES`, returns a `Conversion`; the shared
loader (`interop.huggingface.from_huggingface`) reads the checkpoint
into the model by the table. docs/guides/checkpoints.md ("Adding a
family") says how to add one.
"""

import collections

# The families are modules of this package, imported by name from
# `interop.huggingface`; it re-exports nothing.
__all__ = []

# What a family's converter returns: the model (weights not yet
# loaded), its weight table, the number of layers the table's `{i}`
# rows run over, `fnmatch` patterns of tensors left unread on purpose,
# and optionally `check(checkpoint)`, run before loading: it refuses a
# stored value the model cannot hold, naming it (no family needs one
# now: Gemma 4's `layer_scalar`, once refused, converts).
Conversion = collections.namedtuple(
    "Conversion",
    ("model", "table", "num_layers", "ignored", "check"),
    defaults=(None,),
)
