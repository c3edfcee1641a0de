"""The `keras_hub` samplers of the generators (private to `generation`):
`get_sampler` resolves a name or a sampler, `sampler_key` keys the
compiled loops, `is_streamable` tells whether one can generate in pieces.
"""


def get_sampler(sampler):
    """A `keras_hub` sampler from its name, or the sampler itself; raises
    `ValueError` for anything else (an unknown name, None, ...)."""
    import keras_hub  # an optional extra, needed only to generate

    resolved = sampler
    if isinstance(sampler, str):
        try:
            resolved = keras_hub.samplers.get(sampler)
        except (KeyError, ValueError):  # "Greedy": names are lowercase
            resolved = None
    if not isinstance(resolved, keras_hub.samplers.Sampler):
        raise ValueError(
            "`sampler` must be a `keras_hub.samplers.Sampler` or the name "
            'of one ("greedy", "beam", "top_k", "top_p", "random", '
            f'"contrastive"). Received: sampler={sampler!r}'
        )
    return resolved


def sampler_key(sampler):
    """Samplers given by name share one compiled loop; objects by identity."""
    return sampler if isinstance(sampler, str) else id(sampler)


def is_streamable(sampler):
    """Whether `sampler` draws each token from the logits alone (the base
    `keras_hub` loop: greedy, top-k, top-p, random), so that generation
    can be split into pieces."""
    import keras_hub  # an optional extra, needed only to generate

    base = keras_hub.samplers.Sampler.__call__
    return type(sampler).__call__ is base


def uses_hidden_states(sampler):
    """Whether `sampler` reads the prompts' hidden states (contrastive
    search compares each candidate's with them); the others ignore them,
    so the generators need not keep a `(batch, max_length, d)` buffer."""
    import keras_hub  # an optional extra, needed only to generate

    return isinstance(sampler, keras_hub.samplers.ContrastiveSampler)
