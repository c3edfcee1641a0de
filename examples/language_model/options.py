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
