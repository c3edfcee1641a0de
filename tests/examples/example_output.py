"""What `python -m examples.<name>` prints besides its results.

The example tests run an example's `main` in the test process;
`captured()` records what a user would see of the Python warnings and the
logging on the terminal meanwhile, and `problems` lists the lines nobody
running the example can act on (issue 23: tf.data, Keras and SavedModel
messages about the examples' own code).

TensorFlow's C++ log lines (such as tf.data's cache warning) go to file
descriptor 2 and are silenced in the test process (`TF_CPP_MIN_LOG_LEVEL`
is 3 in tests/conftest.py): `problems` checks them in the output of a
subprocess (`python -m examples.translate` in test_translate.py).
"""

import contextlib
import dataclasses
import importlib
import io
import logging
import re
import sys
import warnings

# Messages the examples used to print (issue 23), each caused by the
# examples' own use of a library.
KNOWN = (
    # tf.data (C++): part of a cached dataset read, the cache discarded.
    "did not fully read the dataset being cached",
    # Keras `fit` on a tf.data.Dataset with its default shuffle=True.
    "`shuffle=True` was passed",
    # Keras `evaluate` reaching the end of a dataset of unknown size.
    "Your input ran out of data",
    # TensorFlow's SavedModel export, INFO (the root logger at INFO).
    "with unsupported characters",
    "Assets written to",
    # A Keras layer without masking given a masked input.
    "does not support masking",
)
# Python warnings as `warnings.showwarning` prints them, and TensorFlow's
# C++ warnings ("W0000 00:00:1796099637.972281 3892 file.cc:912] ...").
PYTHON_WARNING = re.compile(r"\b[A-Z]\w*Warning: ")
CPP_WARNING = re.compile(r"^W\d{4} ", re.MULTILINE)
# Categories Python's default warning filters do not show.
HIDDEN_BY_DEFAULT = (
    DeprecationWarning,
    PendingDeprecationWarning,
    ImportWarning,
    ResourceWarning,
)


@dataclasses.dataclass
class Output:
    """`warnings`: the Python warnings shown ("Category: message");
    `log`: what the logging handlers printed."""

    warnings: list = dataclasses.field(default_factory=list)
    log: str = ""

    def problems(self):
        return [f"warning: {w}" for w in self.warnings] + problems(self.log)


def problems(text):
    """The lines of `text` that are warnings or known library messages."""
    return [
        line
        for line in text.splitlines()
        if any(message in line for message in KNOWN)
        or PYTHON_WARNING.search(line)
        or CPP_WARNING.match(line)
    ]


@contextlib.contextmanager
def captured():
    """Records the warnings and log output of the code it runs, as a fresh
    `python -m examples.<name>` would show them: the root logger starts
    without handlers at Python's default level (WARNING), so the example's
    logging setup applies as it does in a new process; what its handlers
    print to `sys.stderr` is recorded. Yields an `Output`, filled on exit.
    """
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    saved_stderr = sys.stderr
    stream = io.StringIO()
    output = Output()
    root.handlers = []
    root.setLevel(logging.WARNING)
    sys.stderr = stream
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield output
    finally:
        sys.stderr = saved_stderr
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers = handlers
        root.setLevel(level)
        output.log = stream.getvalue()
        shown = []
        for w in caught:
            text = f"{w.category.__name__}: {w.message}"
            if not issubclass(w.category, HIDDEN_BY_DEFAULT) and (
                text not in shown
            ):
                shown.append(text)
        output.warnings = shown


def quick_run(tmp_path_factory, example, *args, data_dir=False):
    """`python -m examples.<example> --quick --output-dir <tmp>/run args...`
    in this process (`--data-dir <tmp>/tfds` too when `data_dir`), with its
    output recorded (`captured`): the one way the example tests run an
    example. Returns the dict `main` returns, plus `output` (the recorded
    text), `output_dir` and, with `data_dir`, `data_dir`."""
    module = importlib.import_module(f"examples.{example}.__main__")
    tmp = tmp_path_factory.mktemp(example)
    argv = ["--quick", "--output-dir", str(tmp / "run"), *args]
    if data_dir:
        argv += ["--data-dir", str(tmp / "tfds")]
    with captured() as output:
        results = module.main(argv)
    results["output"] = output
    results["output_dir"] = str(tmp / "run")
    if data_dir:
        results["data_dir"] = str(tmp / "tfds")
    return results
