import os
import sys

# Silence TensorFlow before anything imports it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")

sys.path.insert(0, os.path.dirname(__file__))

import keras  # noqa: E402
import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if keras.backend.backend() == "tensorflow":
        return
    skip = pytest.mark.skip(reason="needs the TensorFlow backend")
    for item in items:
        if "tf_only" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "tf_only: runs only on the TensorFlow backend"
    )
    config.addinivalue_line("markers", "slow: long-running tests")


@pytest.fixture(autouse=True)
def _reset_keras_state():
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    yield
    keras.config.set_dtype_policy("float32")
