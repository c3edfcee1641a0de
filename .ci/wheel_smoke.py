"""What `pip install keras-attention-layers` gives a user must work, not only
the editable checkout: run by `.ci/run` with the interpreter of a fresh
virtual environment into which only the built wheel was installed, from a
directory outside the repository (so the checkout cannot be imported).

Checks: the package imports from site-packages; no `examples` (or other
stray top-level package) came with it; a small model with the main layers
trains one step, saves to `.keras` and loads back with equal outputs.
"""

import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import importlib.metadata as metadata  # noqa: E402
import importlib.util  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_attention  # noqa: E402


def check_installed_files():
    where = os.path.dirname(keras_attention.__file__)
    if "site-packages" not in where:
        sys.exit(f"keras_attention imported from {where}, not the wheel")
    files = metadata.files("keras-attention-layers")
    tops = sorted(
        {
            f.parts[0]
            for f in files
            if not f.parts[0].endswith((".dist-info", ".pth", "__pycache__"))
        }
    )
    if tops != ["keras_attention"]:
        sys.exit(f"the wheel installs top-level {tops}, want keras_attention")
    if importlib.util.find_spec("examples") is not None:
        sys.exit(
            "an `examples` package is importable after installing the wheel"
        )
    if (
        metadata.version("keras-attention-layers")
        != keras_attention.__version__
    ):
        sys.exit("the wheel's version differs from keras_attention.__version__")


def model():
    layers = keras_attention.layers
    tokens = keras.Input((6,), dtype="int32")
    x = layers.TokenAndPositionEmbedding(20, 6, 8, mask_zero=True)(tokens)
    x = layers.SelfAttention(num_heads=2, key_dim=4)(x)
    x = layers.LocalSelfAttention(num_heads=2, key_dim=4, window_size=2)(x)
    memory = keras.layers.GRU(8, return_sequences=True)(x)
    x = layers.BahdanauAttention(units=8)(x, memory)
    x = layers.AttentionPooling(units=4)(x)
    outputs = keras.layers.Dense(3)(x)
    return keras.Model(tokens, outputs)


def main():
    check_installed_files()
    net = model()
    net.compile("adam", keras.losses.SparseCategoricalCrossentropy(True))
    x = np.array([[3, 4, 5, 0, 0, 0], [1, 2, 3, 4, 5, 6]], "int32")
    net.fit(x, np.array([0, 2]), epochs=1, verbose=0)
    path = os.path.join(tempfile.mkdtemp(), "smoke.keras")
    net.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), net.predict(x, verbose=0), atol=1e-6
    )
    version = keras_attention.__version__
    where = os.path.dirname(keras_attention.__file__)
    print(f"wheel smoke test passed: keras_attention {version} from {where}")


if __name__ == "__main__":
    main()
