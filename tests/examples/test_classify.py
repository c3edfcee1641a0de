"""Tests of `python -m examples.classify`: data, vocabulary, and a tiny
end-to-end run (training, export, serving in a fresh process, plots)."""

import gzip
import json
import os
import struct
import subprocess
import sys

import example_output
import numpy as np
import pytest
import serving
from tensorboard_events import attention_image_tags

pytestmark = pytest.mark.tf_only

# Serving needs TensorFlow and TensorFlow Text's kernels only: keras,
# keras_hub and keras_attention cannot be imported in the serving process.
SERVE = """
    import json

    import tensorflow as tf

    served = tf.saved_model.load(sys.argv[1])
    out = served.classify(tf.constant(json.loads(sys.argv[2])))
    answer({
        "label": [s.decode() for s in out["label"].numpy()],
        "probability": out["probability"].numpy().tolist(),
    })
"""


def _png_size(path):
    with open(path, "rb") as f:
        header = f.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR"
    return struct.unpack(">II", header[16:24])


def test_parse_data_noun_reads_supersense_and_definition():
    from examples.data.wordnet_glosses import NOUN_CLASSES
    from examples.data.wordnet_glosses import parse_data_noun

    lines = [
        "  1 This software and database is being provided to you\n",
        "00005930 03 n 01 dwarf 0 001 @ 00004475 n 0000 | a plant  \n",
        "01234567 05 n 01 cat 0 000 | feline mammal; has fur; "
        '"the cat purred"; "a cat"  \n',
        "07654321 28 n 01 noon 0 000 | midday  \n",
    ]
    rows = list(parse_data_noun(lines))
    # noun.Tops (03) is not a class; lex files 04.. map to NOUN_CLASSES.
    assert rows == [
        (NOUN_CLASSES[5 - 4], "01234567", "feline mammal; has fur"),
        ("time", "07654321", "midday"),
    ]
    assert NOUN_CLASSES[5 - 4] == "animal" and len(NOUN_CLASSES) == 25


def test_shipped_glosses_are_labelled_and_split_without_overlap():
    from examples.data.wordnet_glosses import DATA_FILE
    from examples.data.wordnet_glosses import NOUN_CLASSES
    from examples.data.wordnet_glosses import read_glosses
    from examples.data.wordnet_glosses import split_of

    rows = list(read_glosses(DATA_FILE))
    assert len(rows) > 80000
    assert {label for label, _, _ in rows} == set(NOUN_CLASSES)
    offsets = [offset for _, offset, _ in rows]
    assert len(set(offsets)) == len(offsets)
    splits = np.array([split_of(o) for o in offsets])
    for split, share in [("train", 0.8), ("validation", 0.1), ("test", 0.1)]:
        assert abs(np.mean(splits == split) - share) < 0.01
    with gzip.open(DATA_FILE, "rt", encoding="utf-8") as f:
        assert all(line.count("\t") == 2 for line in f)


def test_frequent_word_piece_vocabulary_covers_every_word():
    import keras_hub

    from examples.classify.vocabulary import frequent_word_piece_vocabulary
    from examples.common.text import RESERVED_TOKENS

    texts = ["a cat, a dog.", b"the cat sat", "Zebra"]
    vocabulary = frequent_word_piece_vocabulary(texts, vocabulary_size=64)
    assert vocabulary[: len(RESERVED_TOKENS)] == RESERVED_TOKENS
    assert len(vocabulary) == len(set(vocabulary)) <= 64
    # After the characters (single-character words like "a" among them),
    # the most frequent words first.
    words = vocabulary[vocabulary.index("##z") + 1 :]
    assert words[0] == "cat" and "zebra" in words and "a" not in words
    # A vocabulary too small for whole words still covers every character.
    small = frequent_word_piece_vocabulary(texts, vocabulary_size=10)
    tokenizer = keras_hub.tokenizers.WordPieceTokenizer(
        vocabulary=small, lowercase=True, oov_token="[UNK]"
    )
    ids = np.asarray(tokenizer("zebra sat"))
    assert small.index("[UNK]") not in ids
    assert str(np.asarray(tokenizer.detokenize(ids)).item()) == "zebra sat"


def test_classifier_attention_model_matches_numpy_pooling():
    from examples.classify.model import build_classifier

    model, attention_model = build_classifier(
        50, 3, encoder="gru", embedding_dim=8, hidden_dim=8
    )
    ids = np.array([[5, 7, 9, 0, 0], [3, 0, 0, 0, 0]], "int32")
    probabilities, weights = (np.asarray(t) for t in attention_model(ids))
    logits = np.asarray(model(ids))
    np.testing.assert_allclose(
        probabilities,
        np.exp(logits) / np.exp(logits).sum(-1, keepdims=True),
        atol=1e-5,
    )
    # Pooling weights: a distribution over the real tokens, 0 on padding.
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert np.all(weights[ids == 0] == 0)
    # Padding does not change the result.
    p_short, _ = attention_model(ids[:1, :3])
    np.testing.assert_allclose(
        np.asarray(p_short), probabilities[:1], atol=1e-5
    )


def _tiny_transformer(num_layers=2):
    import keras

    from examples.classify.model import build_classifier

    keras.utils.set_random_seed(3)
    model, attention_model = build_classifier(
        30,
        4,
        encoder="transformer",
        max_length=8,
        hidden_dim=8,
        num_layers=num_layers,
        num_heads=2,
        dropout=0.0,
    )
    ids = np.array([[5, 7, 9, 4, 0, 0], [3, 6, 0, 0, 0, 0]], "int32")
    model(ids)
    return model, attention_model, ids


def test_rollout_into_the_pooling_matches_numpy():
    """`explain`'s rollout is `w · Â_2 · Â_1` with `Â_l` the heads'
    mean attention of block `l`, halved and given half the identity
    (residual), and `w` the pooling weights: recomputed here with NumPy
    loops from the attention weights of the encoder blocks."""
    from examples.classify.explain import explain
    from keras_attention.visualization import collect_attention

    model, attention_model, ids = _tiny_transformer()
    measures = explain(attention_model, ids)
    maps = collect_attention(model, ids)
    blocks = [maps[f"encoder_block_{i}/self_attention"] for i in (0, 1)]
    probabilities, pooling = (np.asarray(t) for t in attention_model(ids))
    np.testing.assert_allclose(measures["pooling"], pooling, atol=1e-6)
    np.testing.assert_allclose(
        measures["probabilities"], probabilities, atol=1e-6
    )
    for b in range(len(ids)):
        n = int((ids[b] != 0).sum())
        # R = Â_2 Â_1, so w · R = (w · Â_2) · Â_1: the top block first.
        flow = pooling[b, :n].astype("float64")
        for weights in reversed(blocks):
            a = weights[b, :, :n, :n].astype("float64").mean(axis=0)
            a_hat = np.zeros((n, n))
            for i in range(n):
                row = a[i] / 2
                row[i] += 0.5
                a_hat[i] = row / row.sum()
            flow = np.array(
                [sum(flow[i] * a_hat[i, j] for i in range(n)) for j in range(n)]
            )
        np.testing.assert_allclose(
            measures["rollout"][b, :n], flow, rtol=1e-5, atol=1e-6
        )
        assert np.all(measures["rollout"][b, n:] == 0)
        assert measures["rollout"][b].sum() == pytest.approx(1.0, abs=1e-5)


def test_rollout_of_uniform_attention_has_a_closed_form():
    """With the query projections zeroed every block attends uniformly
    (`U`, 1/n over the n real tokens), `Â = (U + I) / 2` and, U being
    idempotent, `Â² = (3U + I) / 4`: two blocks give `w / 4 + 3 / (4n)`."""
    from examples.classify.explain import explain

    model, attention_model, ids = _tiny_transformer()
    for variable in model.weights:
        if "/query/" in variable.path:
            variable.assign(np.zeros(variable.shape, variable.dtype))
    measures = explain(attention_model, ids)
    for b in range(len(ids)):
        n = int((ids[b] != 0).sum())
        w = measures["pooling"][b, :n]
        np.testing.assert_allclose(
            measures["rollout"][b, :n], w / 4 + 3 / (4 * n), atol=1e-6
        )
        assert np.all(measures["rollout"][b, n:] == 0)
    # One block: Â = (U + I) / 2, so w / 2 + 1 / (2n).
    model, attention_model, ids = _tiny_transformer(num_layers=1)
    for variable in model.weights:
        if "/query/" in variable.path:
            variable.assign(np.zeros(variable.shape, variable.dtype))
    measures = explain(attention_model, ids)
    n = int((ids[0] != 0).sum())
    np.testing.assert_allclose(
        measures["rollout"][0, :n],
        measures["pooling"][0, :n] / 2 + 1 / (2 * n),
        atol=1e-6,
    )


def test_rollout_without_self_attention_is_the_pooling_weights():
    from examples.classify.explain import explain
    from examples.classify.model import build_classifier

    _, attention_model = build_classifier(
        50, 3, encoder="gru", embedding_dim=8, hidden_dim=8
    )
    measures = explain(
        attention_model, np.array([[5, 7, 9, 0], [3, 0, 0, 0]], "int32")
    )
    np.testing.assert_array_equal(measures["rollout"], measures["pooling"])


def test_explanation_figure_labels_its_axes():
    # The pooling plots used plot_attention's axis names of a translation,
    # "generated" and "source".
    from examples.classify.explain import explanation_figure

    tokens = ["a", "person", "who", "writes", "poems"]
    pooling = np.array([0.18, 0.22, 0.2, 0.2, 0.2])
    rollout = np.array([0.05, 0.5, 0.25, 0.1, 0.1])
    figure = explanation_figure(tokens, pooling, rollout, title="person")
    top, bottom = figure.axes
    assert top.get_ylabel() == "pooling weight"
    assert bottom.get_ylabel() == "attention rollout\ninto the pooling"
    assert bottom.get_xlabel() == "word pieces of the definition"
    labels = [a.get_xlabel() + a.get_ylabel() for a in figure.axes]
    assert not any(
        word in label
        for label in labels
        for word in ("generated", "source", "target")
    )
    assert [t.get_text() for t in bottom.get_xticklabels()] == tokens
    for axis, values in ((top, pooling), (bottom, rollout)):
        heights = [bar.get_height() for bar in axis.patches]
        np.testing.assert_allclose(heights, values, rtol=1e-6)
        # The dashed line: the uniform share.
        (line,) = axis.get_lines()
        assert line.get_ydata()[0] == pytest.approx(1 / len(tokens))


def test_unknown_encoder_is_rejected():
    from examples.classify.model import build_classifier

    with pytest.raises(ValueError, match="encoder='lstm'"):
        build_classifier(50, 3, encoder="lstm")


def test_unprepared_tfds_dataset_is_an_error_without_download(tmp_path):
    from examples.classify import __main__ as classify
    from examples.classify import data

    args = classify.parse_args(
        ["--dataset", "imdb_reviews", "--data-dir", str(tmp_path)]
    )
    with pytest.raises(ValueError, match="--download"):
        data.load_splits(args.dataset, args.data_dir, args.download)


def test_help():
    out = subprocess.run(
        [sys.executable, "-m", "examples.classify", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    assert out.returncode == 0, out.stderr
    assert "--encoder" in out.stdout and "--strategy" in out.stdout
    assert "--backup-dir" in out.stdout


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    return example_output.quick_run(tmp_path_factory, "classify", data_dir=True)


def test_quick_run_learns(quick_run):
    losses = quick_run["history"]["loss"]
    assert len(losses) == 2 and losses[-1] < losses[0]
    assert 0.0 <= quick_run["test_accuracy"] <= 1.0
    assert 0.0 < quick_run["baseline_accuracy"] < 1.0
    assert os.path.exists(
        os.path.join(
            os.path.dirname(quick_run["export_path"]),
            "checkpoints",
            "best.weights.h5",
        )
    )


def test_quick_run_prints_no_warnings(quick_run):
    # It used to print Keras's "`shuffle=True` was passed, but will be ignored",
    # "Your input ran out of data" (evaluate) and the SavedModel export's INFO
    # "Function `classify` contains input name(s) ... with unsupported
    # characters".
    output = quick_run["output"]
    assert "backend: tensorflow" in output.log  # the run's own messages
    found = output.problems()
    assert not found, "\n".join(found)


def test_quick_run_plots_valid_pngs(quick_run):
    assert len(quick_run["plots"]) == 2
    for path, (width, height) in quick_run["plots"]:
        assert _png_size(path) == (width, height)
        assert width > 100 and height > 100
    # The measures plotted: both distributions over each text's tokens.
    measures = quick_run["measures"]
    assert len(quick_run["plotted_texts"]) == 2
    for name in ("pooling", "rollout"):
        np.testing.assert_allclose(measures[name].sum(-1), 1.0, atol=1e-5)


def test_quick_run_writes_the_attention_explorer(quick_run):
    import re

    path = quick_run["explorer"]
    assert path == os.path.join(
        os.path.dirname(quick_run["export_path"]), "attention.html"
    )
    with open(path, encoding="utf-8") as f:
        html = f.read()
    assert html.startswith("<!DOCTYPE html>")
    assert "http://" not in html and "https://" not in html
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", html)
    # Every attention layer: the encoder block's and the pooling.
    assert "encoder_block_0/self_attention" in html and "pooling" in html


def test_quick_run_logs_attention_images_to_tensorboard(quick_run):
    tags = attention_image_tags(os.path.dirname(quick_run["explorer"]))
    for layer in ("encoder_block_0/self_attention", "pooling"):
        for i in range(3):  # three probe definitions
            assert f"attention/{layer}/example_{i}" in tags


def test_exported_model_answers_like_the_python_model(quick_run):
    texts = [
        "a large wild cat with a striped coat",
        "a person who writes poems",
        "an unseen word: xylophonist",
    ]
    expected = quick_run["server"].classify(np.array(texts, dtype=object))
    served = serving.answer_in_fresh_process(
        SERVE,
        args=[quick_run["export_path"], json.dumps(texts)],
        blocked_modules=serving.BLOCKED_MODULES + serving.KERAS_MODULES,
        tensorflow_text_ops=True,
    )
    assert served["label"] == [s.decode() for s in expected["label"].numpy()]
    np.testing.assert_allclose(
        served["probability"], expected["probability"].numpy(), atol=1e-5
    )


def test_majority_baseline():
    import tensorflow as tf

    from examples.classify.data import majority_baseline

    train = tf.data.Dataset.from_tensor_slices((["a", "b", "c"], [1, 1, 2]))
    test = tf.data.Dataset.from_tensor_slices(
        (["d", "e", "f", "g"], [1, 0, 1, 1])
    )
    assert majority_baseline(train, test) == pytest.approx(0.75)


def test_help_names_the_default_encoder(capsys):
    # `--help` used to describe the GRU as the default encoder.
    from examples.classify import __main__ as classify

    assert classify.parse_args([]).encoder == "transformer"
    with pytest.raises(SystemExit):
        classify.parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    encoder_help = help_text.split("--encoder {gru,transformer}", 2)[2]
    assert (
        encoder_help.split("--embedding-dim")[0]
        .strip()
        .endswith("(default: transformer)")
    )
    # The docstring (shown as the epilog) offers the non-default as the option.
    assert "--encoder gru" in help_text
    assert "--encoder transformer" not in help_text
    assert "GRU, or transformer" not in " ".join(classify.__doc__.split())


def test_help_defaults_are_not_contradicted():
    # `--steps-per-epoch` said "one pass over the training split" next to
    # "(default: 250)" in language_model; defaults shown once.
    import argparse

    from examples.common import HelpFormatter
    from examples.common import add_training_args

    for steps, shown in (
        (None, "one pass over the training split"),
        (250, "250"),
    ):
        parser = argparse.ArgumentParser(formatter_class=HelpFormatter)
        add_training_args(parser, steps_per_epoch=steps, output_dir="runs/x")
        help_text = " ".join(parser.format_help().split())
        assert f"steps per epoch (default: {shown})" in help_text
        assert "split) (default:" not in help_text
        assert "(default: None)" not in help_text
        assert (
            "XLA-compile the train step (default: on with a GPU)" in help_text
        )
