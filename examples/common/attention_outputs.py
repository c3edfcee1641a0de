"""The attention outputs of the examples: the interactive explorer
(`runs/<example>/attention.html`) and TensorBoard attention images
(`runs/<example>/logs/attention`).

Both read the attention of every attention layer of a trained model with
`keras_attention.collect_attention`, without rewiring the
model.
"""

import os

from keras_attention.visualization import AttentionMaps
from keras_attention.visualization import AttentionTensorBoard
from keras_attention.visualization import attention_html
from keras_attention.visualization import collect_attention

EXPLORER_FILE = "attention.html"


def collect(model, inputs, prefix=None):
    """`collect_attention(model, inputs)`, layer names under `prefix/`
    when given (several models' attentions in one explorer: layer names
    are unique per model only)."""
    maps = collect_attention(model, inputs)
    if prefix is None:
        return maps
    return AttentionMaps(
        [(f"{prefix}/{name}", w) for name, w in maps.items()],
        {f"{prefix}/{name}": m for name, m in maps.metadata.items()},
    )


def merge(maps):
    """One `AttentionMaps` of several (metadata kept)."""
    merged = AttentionMaps()
    for m in maps:
        merged.update(m)
        merged.metadata.update(getattr(m, "metadata", {}))
    return merged


def write_explorer(
    output_dir, attentions, tokens, target_tokens=None, title=None
):
    """Writes `attentions` (layer name -> `(batch, heads, Tq, Tk)`) as the
    explorer `<output_dir>/attention.html`; returns its path.

    `tokens` (and `target_tokens` for encoder–decoder models) hold one
    list of strings per batch item, without padding.
    """
    path = os.path.join(output_dir, EXPLORER_FILE)
    os.makedirs(output_dir, exist_ok=True)
    attention_html(
        attentions,
        [list(t) for t in tokens],
        target_tokens=(
            None if target_tokens is None else [list(t) for t in target_tokens]
        ),
        path=path,
        title=title,
    )
    return path


def model_explorer(
    output_dir, model, inputs, tokens, target_tokens=None, title=None
):
    """`write_explorer` of the attention of every attention layer of
    `model` on `inputs` (`collect_attention`)."""
    attentions = collect(model, inputs)
    return write_explorer(output_dir, attentions, tokens, target_tokens, title)


def tensorboard_images(
    output_dir, probe_inputs, tokens, target_tokens=None, every_n_epochs=1
):
    """The `AttentionTensorBoard` callback of an example: attention heatmaps
    of `probe_inputs` every `every_n_epochs` epochs, in
    `<output_dir>/logs/attention` (next to the `TensorBoard` callback's
    logs of `examples.common.fit`: `tensorboard --logdir
    <output_dir>/logs`)."""
    return AttentionTensorBoard(
        os.path.join(output_dir, "logs"),
        probe_inputs,
        every_n_epochs=every_n_epochs,
        tokens=[list(t) for t in tokens],
        target_tokens=(
            None if target_tokens is None else [list(t) for t in target_tokens]
        ),
    )
