"""Tests of `python -m examples.caption`: the composed digit canvases and
their split by composition, the doubly stochastic penalty, and a
`--quick` run (both decoders: the table, the attention PNGs, the
explorer, and the SavedModels served in a fresh process without keras
or keras_attention)."""

import json
import os
import struct

import example_output
import numpy as np
import pytest
import serving

pytestmark = pytest.mark.tf_only


def _png_size(path):
    with open(path, "rb") as f:
        header = f.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR"
    return struct.unpack(">II", header[16:24])


def test_canvases_hold_their_digits_and_splits_share_no_caption():
    from examples.caption import data

    pools = data.load_pools()
    sizes = [len(pools[s][1]) for s in data.SPLITS]
    assert sum(sizes) == 1797 and sizes[2] > sizes[1] > 0
    canvases = {}
    for split in data.SPLITS:
        images, strings, boxes = data.compose(pools[split], 200, split, seed=0)
        assert images.shape == (200, data.HEIGHT, data.WIDTH)
        assert images.min() >= 0.0 and images.max() <= 1.0
        canvases[split] = {tuple(s) for s in strings}
        for digits, box in zip(strings, boxes):
            assert data.split_of(digits) == split
            assert 2 <= len(digits) <= 5
            inside = box[: len(digits)]
            assert np.all(inside[:, 0] >= 0) and np.all(inside[:, 2] <= 16)
            assert np.all(inside[:, 1] >= 0) and np.all(inside[:, 3] <= 64)
            # Left to right, 0-3 pixels apart, no overlap.
            gaps = inside[1:, 1] - inside[:-1, 3]
            assert np.all((gaps >= 0) & (gaps <= data.MAX_GAP))
            assert np.all(box[len(digits) :] == -1)
        again = data.compose(pools[split], 200, split, seed=0)
        np.testing.assert_array_equal(again[0], images)
    assert not canvases["train"] & canvases["test"]
    assert not canvases["train"] & canvases["validation"]
    # The pools share no image.
    flat = [pools[s][0].reshape(len(pools[s][0]), -1) for s in data.SPLITS]
    train = {row.tobytes() for row in flat[0]}
    assert not train & {row.tobytes() for row in flat[2]}


def test_captions_encode_and_decode():
    from examples.caption import data

    assert data.caption([4, 1, 7]) == "four one seven"
    decoder_ids, targets = data.encode([[4, 1, 7], [0, 9]])
    assert decoder_ids.tolist() == [[1, 7, 4, 10, 0, 0], [1, 3, 12, 0, 0, 0]]
    assert targets.tolist() == [[7, 4, 10, 2, 0, 0], [3, 12, 2, 0, 0, 0]]
    assert data.decode(targets) == ["four one seven", "zero nine"]
    # Special tokens dropped, nothing after [END].
    assert data.decode([[1, 5, 0, 6, 2, 7]]) == ["two three"]


def test_doubly_stochastic_penalty_matches_the_formula():
    import keras

    from examples.caption.model import DoublyStochasticPenalty

    rng = np.random.default_rng(0)
    alignment = rng.dirichlet(np.ones(5), size=(3, 4)).astype("float32")
    alignment[0, 3] = 0.0  # a padded step
    logits = rng.normal(size=(3, 4, 7)).astype("float32")
    layer = DoublyStochasticPenalty(0.5)
    out = layer(logits, alignment)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(out), logits)
    expected = np.mean(np.sum((1.0 - alignment.sum(axis=1)) ** 2, axis=-1))
    (loss,) = layer.losses
    assert float(loss) == pytest.approx(0.5 * expected, rel=1e-5)


def test_unknown_decoder_is_rejected(capsys):
    from examples.caption import __main__ as caption

    with pytest.raises(SystemExit):
        caption.parse_args(["--decoders", "show_attend_tell,lstm"])
    error = capsys.readouterr().err
    assert "--decoders" in error and "unknown: lstm" in error


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    return example_output.quick_run(tmp_path_factory, "caption")


def test_quick_run_reports_both_decoders(quick_run):
    rows = {row["decoder"]: row for row in quick_run["summary"]}
    assert list(rows) == ["show_attend_tell", "transformer"]
    assert quick_run["shared_captions"] == 0
    for row in rows.values():
        for key in ("exact_match", "bleu", "word_accuracy"):
            assert 0.0 <= row[key] <= 1.0
        by_length = row["exact_match_by_length"]
        assert set(by_length) <= {"2", "3", "4", "5"} and by_length
        assert all(0.0 <= v <= 1.0 for v in by_length.values())
        assert row["ms_per_step"] > 0 and row["steps"] == 32
        assert np.isfinite(row["final_loss"]) and row["parameters"] > 0
    with open(os.path.join(quick_run["output_dir"], "results.md")) as f:
        report = f.read()
    assert "| Show, Attend and Tell (LSTM + Bahdanau) |" in report
    assert "| transformer decoder |" in report
    assert "| decoder | 2 digits | 3 digits |" in report
    with open(os.path.join(quick_run["output_dir"], "results.json")) as f:
        assert len(json.load(f)["summary"]) == 2


def test_quick_run_prints_no_warnings(quick_run):
    output = quick_run["output"]
    assert "backend: tensorflow" in output.log
    found = output.problems()
    assert not found, "\n".join(found)


def test_quick_run_draws_the_attention_of_each_word(quick_run):
    for kind, outputs in quick_run["outputs"].items():
        assert len(outputs["plots"]) == 2
        for path in outputs["plots"]:
            width, height = _png_size(path)
            assert width >= 250 and height >= 150
            assert os.path.getsize(path) < 200_000


def test_quick_run_writes_the_attention_explorer(quick_run):
    path = quick_run["outputs"]["show_attend_tell"]["html"]
    with open(path, encoding="utf-8") as f:
        html = f.read()
    assert html.startswith("<!DOCTYPE html>")
    assert "http://" not in html and "https://" not in html
    assert "r3c15" in html  # the grid cells label the keys
    assert "ka-image-view" in html  # the image mode


def test_saved_models_caption_images_in_a_fresh_process(quick_run, tmp_path):
    """Each SavedModel, loaded where keras and keras_attention cannot be
    imported, captions test images as the run did in process."""
    from examples.caption import data

    images = data.make_splits({"test": 4})["test"][0][..., 0]
    np.save(tmp_path / "images.npy", images)
    paths = [o["saved_model"] for o in quick_run["outputs"].values()]
    code = """
        import numpy as np
        import tensorflow as tf

        images = tf.constant(np.load(sys.argv[1]))
        out = []
        for path in sys.argv[2:]:
            served = tf.saved_model.load(path)
            result = served.caption(images)
            out.append(
                {
                    "captions": [s.decode() for s in result["caption"].numpy()],
                    "attention": list(result["attention"].shape),
                    "row_sums": result["attention"].numpy().sum(-1).tolist(),
                }
            )
        answer(out)
    """
    answers = serving.answer_in_fresh_process(
        code,
        args=[tmp_path / "images.npy", *paths],
        blocked_modules=serving.BLOCKED_MODULES + serving.KERAS_MODULES,
    )
    # Two epochs on 1,000 canvases: not yet right, but words.
    assert any(c for served in answers for c in served["captions"])
    for served, outputs in zip(answers, quick_run["outputs"].values()):
        assert served["attention"] == [4, data.MAX_STEPS, 64]
        expected = [e["generated"] for e in outputs["examples"][:4]]
        assert served["captions"] == expected
        for caption, sums in zip(served["captions"], served["row_sums"]):
            words = caption.split()
            assert len(words) <= data.MAX_DIGITS
            assert set(words) <= set(data.WORDS)
            # One row per generated word and [END], each summing to 1.
            np.testing.assert_allclose(
                [s for s in sums if s > 0], 1.0, atol=1e-4
            )
            assert sum(s > 0 for s in sums) >= min(len(words) + 1, 6)
