import struct

import numpy as np
import pytest
import serving

from keras_attention.visualization import plot_attention


def _png_size(path):
    with open(path, "rb") as f:
        header = f.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert header[12:16] == b"IHDR"
    return struct.unpack(">II", header[16:24])


def test_writes_png_of_the_requested_size(tmp_path):
    weights = np.random.default_rng(0).random((4, 6))
    path = tmp_path / "attention.png"
    fig = plot_attention(
        weights,
        list("abcdef"),
        ["w", "x", "y", "z"],
        path=str(path),
        title="t",
        figsize=(5, 4),
        dpi=50,
    )
    assert _png_size(path) == (250, 200)
    image = fig.axes[0].images[0].get_array()
    np.testing.assert_allclose(image, weights, rtol=1e-6)


def test_labels_cut_padding_and_average_heads():
    rng = np.random.default_rng(1)
    weights = rng.random((2, 5, 7))  # heads, target (padded), source (padded)
    fig = plot_attention(weights, ["a", "b", "c"], ["x", "y"])
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["x", "y"]
    np.testing.assert_allclose(
        ax.images[0].get_array(), weights.mean(0)[:2, :3], rtol=1e-6
    )


def test_default_size_grows_with_tokens():
    small = plot_attention(np.ones((2, 2)), ["a", "b"], ["x", "y"])
    large = plot_attention(np.ones((20, 30)), list("x" * 30), list("y" * 20))
    assert (large.get_size_inches() > small.get_size_inches()).all()


def test_errors():
    with pytest.raises(ValueError, match="weights.shape=\\(2, 2\\)"):
        plot_attention(np.ones((2, 2)), ["a", "b", "c"], ["x"])
    with pytest.raises(ValueError, match="weights.shape=\\(4,\\)"):
        plot_attention(np.ones(4), ["a"], ["x"])
    with pytest.raises(ValueError, match="show_values='False'"):
        plot_attention(np.ones((1, 1)), ["a"], ["x"], show_values="False")


def test_works_without_matplotlib_until_plotting():
    # matplotlib is an optional extra: importing the package must not need
    # it; plotting says how to install it.
    code = """
    import keras_attention.visualization as v

    try:
        v.plot_attention([[1.0]], ["a"], ["b"])
    except ImportError as e:
        answer("pip install matplotlib" in str(e))
    """
    assert serving.answer_in_fresh_process(
        code, blocked_modules=("matplotlib",), pythonpath=(serving.ROOT,)
    )
