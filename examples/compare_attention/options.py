"""Names of the command line's choices, in a module that imports nothing:
`--help` and argument errors need no Keras or TensorFlow (`models.py`
and `tasks.py` import them and check their tables against these)."""

# The variants, in the order of the report (`models.VARIANTS` builds them).
VARIANTS = (
    "rnn-none",
    "rnn-bahdanau",
    "rnn-bahdanau-norm",
    "rnn-luong-dot",
    "rnn-luong-general",
    "rnn-luong-concat",
    "rnn-luong-local-m",
    "rnn-luong-local-p",
    "transformer-full",
    "transformer-local",
    "transformer-gqa",
    "transformer-alibi",
    "transformer-t5",
    "transformer-softcap",
)
# The tasks (`tasks.load_task` builds them).
TASKS = ("dates", "long_dates", "length_generalization")
