"""What a prediction of the classifier rests on, word piece by word piece.

`explain(attention_model, ids)` gives two measures per real token `t` of
each definition, both summing to 1 over the definition:

- `pooling`: the `AttentionPooling` weights `w_t`. They mix the vectors
  of the *last* encoder layer, each of which has already drawn on the
  whole definition through the self-attention of the blocks below: on the
  default run they stay close to uniform (0.05-0.09 over 16 word pieces)
  and say little about which words decided the class.
- `rollout`: `(w · R)_t`, the attention rollout of the encoder blocks'
  self-attention (Abnar & Zuidema, 2020; `examples.common.rollout`)
  carried on into the pooling query: how much of input word piece `t`
  reaches the pooled vector through the attention, the residual
  connections counted. On the default run it singles out the words that
  name the kind of thing defined: "writer" (0.26; pooling weights
  0.06-0.10) in "Irish writer and wit (1854-1900)", "aquatic" and
  "animal" in the Loch Ness monster's definition, which the model calls
  an animal (its label is `person`).

Gradient x input (`x_t · ∂z/∂x_t` for the embedding `x_t` of a token) is
not used: in these pre-norm blocks each token's vector is layer-
normalized before any attention or dense layer reads it, so scaling a
token's embedding barely changes the logits and the measure is near zero
and of mixed sign for every token.

`explanation_figure` draws the two measures as bars over the word pieces.
"""

import numpy as np

from examples.common.rollout import pooled_rollout


def explain(attention_model, ids):
    """The measures of the module docstring on a batch of definitions.

    Args:
        attention_model: `build_classifier`'s model of `(probabilities,
            pooling weights)`.
        ids: `(batch, T)` token ids, 0 pads.

    Returns:
        dict of NumPy float32 arrays: `"pooling"` and `"rollout"` `(batch,
        T)` (0 on padding), `"probabilities"` `(batch, classes)`.
    """
    from examples.common.attention_outputs import collect

    ids = np.asarray(ids, "int32")
    probabilities, weights = attention_model(ids, training=False)
    weights = np.asarray(weights, "float32")  # (b, t)
    maps = collect(attention_model, ids)
    attentions = [
        maps[key]
        for key, meta in maps.metadata.items()
        if meta["kind"] == "self"
    ]  # the encoder blocks', lowest first; none with the GRU encoder
    return {
        "pooling": weights,
        "rollout": pooled_rollout(weights, attentions),
        "probabilities": np.asarray(probabilities, "float32"),
    }


def explanation_figure(tokens, pooling, rollout, title=None, dpi=100):
    """Bars of the two measures over the word pieces of one definition.

    Args:
        tokens: the word pieces (strings), padding excluded.
        pooling, rollout: one value per token (longer arrays are cut).
        title: the figure's title (prediction and label).

    Returns:
        a `matplotlib.figure.Figure` (no pyplot): two panels, one per
        measure, sharing the token axis and the value axis; a dashed line
        marks the uniform share `1 / len(tokens)`.
    """
    from matplotlib.figure import Figure

    n = len(tokens)
    rows = [
        ("pooling weight", np.asarray(pooling, "float32")[:n], "tab:blue"),
        ("attention rollout\ninto the pooling", rollout, "tab:orange"),
    ]
    figure = Figure(figsize=(max(4.0, 0.32 * n + 1.6), 3.6), dpi=dpi)
    axes = figure.subplots(2, 1, sharex=True, sharey=True)
    top = max(float(np.max(np.asarray(v)[:n])) for _, v, _ in rows)
    for axis, (label, values, color) in zip(axes, rows):
        axis.bar(range(n), np.asarray(values, "float32")[:n], color=color)
        axis.axhline(
            1.0 / max(n, 1),
            color="gray",
            linestyle="--",
            lw=0.8,
            label="uniform: 1 / word pieces",
        )
        axis.set_ylabel(label, fontsize=8)
        axis.set_ylim(0.0, 1.15 * top)
        axis.tick_params(labelsize=7)
    axes[0].legend(loc="upper right", fontsize=7, frameon=False)
    axes[-1].set_xticks(range(n), labels=list(tokens), rotation=90)
    axes[-1].set_xlabel("word pieces of the definition", fontsize=8)
    if title:
        figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    return figure
