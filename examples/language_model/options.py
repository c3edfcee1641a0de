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
