"""Choices of the command line, in a module that imports nothing (the
backend is chosen before Keras is imported)."""

# How the model knows where a character is (`--positions`), here so that
# the command line can list them before Keras is imported: rotary queries
# and keys ("rope"; "rotary" is its old name), a learned table
# ("learned"), the fixed sinusoids added to the embeddings
# ("sinusoidal"), ALiBi's per-head linear distance penalty ("alibi") or
# T5's learned bias per relative-position bucket, one table shared by
# every block as in T5 ("t5").
POSITIONS = ("rope", "rotary", "learned", "sinusoidal", "alibi", "t5")

# How the text is cut into training windows (`--documents`; `--pack` is
# `--documents packed`): the default character "stream" cut into windows
# across line boundaries; "packed" lines (documents) one after the other
# in full windows, each attending only to itself (`segment_ids`); or
# "padded", one line per window, padded.
DOCUMENTS = ("stream", "packed", "padded")

# The token mixer of the blocks (`--mixer`): softmax self-attention
# ("attention"), `LinearAttention` with a gate ("linear"), `GatedDeltaNet`
# ("gated_delta"), or a stack of both as Qwen 3.5's ("hybrid": see
# `layer_mixers`).
MIXERS = ("attention", "linear", "gated_delta", "hybrid")

# A hybrid stack: one attention layer per this many layers, the others
# gated delta nets (Qwen 3.5: three gated delta nets, then attention).
HYBRID_PERIOD = 4


def layer_mixers(mixer, num_layers):
    """The mixer of each of `num_layers` blocks (`"attention"`,
    `"linear"` or `"gated_delta"`) for `--mixer mixer`.

    `"hybrid"`: Qwen 3.5's layout, every `HYBRID_PERIOD`-th block an
    attention block and the others gated delta nets, with the last
    block attention too so that every stack of two or more holds one:

    >>> from examples.language_model.options import layer_mixers
    >>> layer_mixers("hybrid", 2)
    ['gated_delta', 'attention']
    >>> layer_mixers("hybrid", 8)[:4]
    ['gated_delta', 'gated_delta', 'gated_delta', 'attention']
    >>> layer_mixers("linear", 3)
    ['linear', 'linear', 'linear']
    """
    if mixer not in MIXERS:
        raise ValueError(
            f"`mixer` must be one of {MIXERS}. Received: mixer={mixer!r}"
        )
    if mixer != "hybrid":
        return [mixer] * num_layers
    if num_layers < 2:
        raise ValueError(
            "A hybrid stack needs at least 2 layers (gated delta nets, "
            f"then attention). Received: num_layers={num_layers!r}"
        )
    return [
        "attention"
        if i % HYBRID_PERIOD == HYBRID_PERIOD - 1 or i == num_layers - 1
        else "gated_delta"
        for i in range(num_layers)
    ]
