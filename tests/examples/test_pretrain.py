"""Tests of `python -m examples.pretrain`: the batches of each objective,
the masks they train with, and one tiny run of all three objectives (the
table and the attention explorer)."""

import os
import re

import example_output
import numpy as np
import pytest

pytestmark = pytest.mark.tf_only

TEXTS = ["a cat sat on the mat", "the dog ran", "a large wild cat", "poems"]


@pytest.fixture(scope="module")
def tokenizer():
    import tensorflow as tf

    from examples.pretrain import data

    return data.make_tokenizer(tf.data.Dataset.from_tensor_slices(TEXTS), 64)


def _batches(tokenizer, objective, max_length=8):
    """All batches (length buckets) of `TEXTS` for `objective`."""
    import tensorflow as tf

    from examples.pretrain import data

    ids = data.encode(
        tf.data.Dataset.from_tensor_slices(TEXTS), tokenizer, max_length
    )
    batches = data.objective_batches(
        ids, objective, tokenizer, 8, max_length, shuffle=False
    )
    return list(batches.as_numpy_iterator())


def test_sequences_start_with_start_and_drop_short_texts(tokenizer):
    import tensorflow as tf

    from examples.pretrain import data

    ids = data.encode(tf.data.Dataset.from_tensor_slices(TEXTS), tokenizer, 5)
    rows = [list(r) for r in ids.as_numpy_iterator()]
    start = tokenizer.token_to_id("[START]")
    # "poems" is [START] + 1 token: shorter than 3, dropped.
    assert len(rows) == 3 and all(r[0] == start for r in rows)
    assert [len(r) for r in rows] == [5, 4, 5]
    assert tokenizer.token_to_id("[MASK]") == 4


def test_clm_and_prefix_lm_targets(tokenizer):
    for x, y, w in _batches(tokenizer, "clm"):
        np.testing.assert_array_equal(x["prefix_length"], 0)
        np.testing.assert_array_equal(w, y != 0)  # every real next token
    for x, y, w in _batches(tokenizer, "prefix_lm"):
        # The inputs drop the last token.
        lengths = (x["token_ids"] != 0).sum(1) + 1
        prefix = x["prefix_length"]
        assert np.all((prefix >= 1) & (prefix <= lengths - 1))
        for row, p in enumerate(prefix):
            # Position t predicts token t + 1: loss on tokens p .. length - 1.
            expected = (np.arange(y.shape[1]) >= p - 1) & (y[row] != 0)
            np.testing.assert_array_equal(w[row], expected)


def test_mlm_masks_only_real_tokens(tokenizer):
    for x, y, w in _batches(tokenizer, "mlm", max_length=20):
        ids, positions = x["token_ids"], x["mask_positions"]
        assert positions.shape[1] == 3  # ceil(0.15 * 20)
        for row in range(len(ids)):
            chosen = positions[row][w[row] > 0]
            assert np.all(chosen >= 1)  # never [START] or padding
            assert np.all(y[row][w[row] > 0] > 4)


def test_packed_rows_have_no_padding_and_number_their_documents(tokenizer):
    import tensorflow as tf

    from examples.pretrain import data

    ids = data.encode(tf.data.Dataset.from_tensor_slices(TEXTS), tokenizer, 8)
    documents = [list(r) for r in ids.as_numpy_iterator()]
    rows = list(data.pack(ids, 4, shuffle=False).as_numpy_iterator())
    flat = [t for d in documents for t in d]
    assert [list(r) for r, _ in rows] == [
        flat[i : i + 4] for i in range(0, len(flat) - 3, 4)
    ]
    segments = np.concatenate([s for _, s in rows])
    lengths = np.bincount(segments)[: len(documents)]
    assert list(lengths[:-1]) == [len(d) for d in documents][: len(lengths) - 1]


def test_packed_clm_targets_stay_in_their_document(tokenizer):
    import tensorflow as tf

    from examples.pretrain import data

    ids = data.encode(tf.data.Dataset.from_tensor_slices(TEXTS), tokenizer, 8)
    batches = data.packed_batches(ids, "clm", tokenizer, 2, 5, shuffle=False)
    for x, y, w in batches.as_numpy_iterator():
        seg = x["segment_ids"]
        assert x["token_ids"].shape == y.shape == seg.shape == (2, 4)
        assert (x["token_ids"] != 0).all()  # no padding
        np.testing.assert_array_equal(x["prefix_length"], 0)
        # A weight of 0 exactly where the next token opens a document.
        start = tokenizer.token_to_id("[START]")
        np.testing.assert_array_equal(w == 0, y == start)
    with pytest.raises(ValueError, match="objective='prefix_lm'"):
        data.packed_batches(ids, "prefix_lm", tokenizer, 2, 5, False)


def test_the_blocks_mask_with_one_prefix_lm_mask_object():
    from examples.pretrain.model import Backbone
    from keras_attention.mods import PrefixLMMask

    backbone = Backbone(10, 8, hidden_dim=8, num_layers=2, num_heads=2)
    for block in backbone.blocks:
        assert isinstance(block.mask_mod, PrefixLMMask)
        assert block.mask_mod.prefix_length is None  # per example


def test_unknown_objective_is_rejected():
    from examples.pretrain.model import Backbone
    from examples.pretrain.model import build_pretraining_model

    with pytest.raises(ValueError, match="objective='t5'"):
        build_pretraining_model(Backbone(10, 8, hidden_dim=8), "t5")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    from examples.pretrain import __main__ as pretrain

    tmp = tmp_path_factory.mktemp("pretrain")
    with example_output.captured() as output:
        results = pretrain.main(
            [
                "--quick",
                "--output-dir",
                str(tmp / "run"),
                "--data-dir",
                str(tmp / "tfds"),
            ]
        )
    results["output"] = output
    return results


def test_quick_run_prints_no_warnings(quick_run):
    # It used to print Keras's "`shuffle=True` was passed, but will be ignored",
    # "Your input ran out of data" (evaluate), "Layer 'mlm_head' (of type
    # MaskedLMHead) was passed an input with a mask attached to it. However,
    # this layer does not support masking" and TFDS's INFO logs.
    output = quick_run["output"]
    assert "corpus wordnet_glosses" in output.log  # the run's own messages
    found = output.problems()
    assert not found, "\n".join(found)


def test_quick_run_prints_one_well_formed_table(quick_run):
    lines = quick_run["table"].splitlines()
    assert lines[0].startswith("| objective | pretrain loss |")
    assert lines[1] == "|---|---|---|---|---|---|---|---|---|"
    assert [line.split("|")[1].strip() for line in lines[2:]] == [
        "none (from scratch)",
        "mlm",
        "clm",
        "prefix_lm",
    ]
    scratch = None
    for line in lines[2:]:
        cells = [c.strip() for c in line.split("|")[1:-1]]
        assert len(cells) == 9
        assert re.fullmatch(r"\d+ \+ \d+", cells[4])
        assert re.fullmatch(r"\d+ s", cells[5])
        if cells[0].startswith("none"):
            assert cells[6:] == ["—", "—", "—"]
        else:  # padded batches (no --pack): some padding, tokens/s > 0
            assert cells[6] == "padded" and int(cells[7]) > 0
            assert re.fullmatch(r"\d+\.\d %", cells[8])
        scratch = scratch or cells[3]
        assert cells[3] == scratch  # the same baseline on every row
        for cell in cells[1:4]:
            assert cell == "—" or re.fullmatch(r"\d+\.\d{3}", cell)
    for row in quick_run["rows"][1:]:
        assert np.isfinite(row["pretrain_loss"]) and row["pretrain_loss"] > 0
        assert 0.0 <= row["finetuned_accuracy"] <= 1.0
    with open(
        os.path.join(os.path.dirname(quick_run["explorer"]), "results.md")
    ) as f:
        assert f.read().strip() == quick_run["table"]


def test_quick_run_writes_a_self_contained_explorer(quick_run):
    path = quick_run["explorer"]
    assert os.path.basename(path) == "attention.html"
    with open(path, encoding="utf-8") as f:
        html = f.read()
    assert html.startswith("<!DOCTYPE html>")
    assert "http://" not in html and "https://" not in html
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", html)
    for objective in ("mlm", "clm", "prefix_lm"):
        assert f"{objective}/encoder_block_0/self_attention" in html


def test_pretrained_models_attend_as_their_objective(quick_run):
    from examples.common import attention_outputs
    from examples.pretrain import __main__ as pretrain

    models = quick_run["models"]
    tokens = np.array([[2, 9, 10, 11, 12, 0]], "int32")  # [START] ... pad
    upper = np.triu(np.ones((6, 6), bool), k=1)
    for objective, model in models.items():
        inputs = pretrain.explorer_inputs(objective, tokens)
        (weights,) = attention_outputs.collect(model, inputs).values()
        real = weights[0, :, :5, :5]  # (heads, 5, 5) without the padding
        if objective == "mlm":  # bidirectional
            assert real[:, upper[:5, :5]].max() > 0
        elif objective == "clm":  # causal
            assert real[:, upper[:5, :5]].max() == 0
        else:  # the prefix (first 2 tokens) sees itself, nothing later
            assert real[:, 0, 1].min() > 0
            assert real[:, :2, 2:].max() == 0
            assert real[:, upper[:5, :5]][:, 1:].max() == 0


def test_quick_packed_clm_run(tmp_path):
    from examples.pretrain import __main__ as pretrain

    with example_output.captured() as output:
        results = pretrain.main(
            [
                "--quick",
                "--objective",
                "clm",
                "--pack",
                "--output-dir",
                str(tmp_path / "run"),
                "--data-dir",
                str(tmp_path / "tfds"),
            ]
        )
    assert not output.problems(), "\n".join(output.problems())
    (row,) = [r for r in results["rows"] if r["objective"] == "clm"]
    speed = row["throughput"]
    assert speed["packed"] and speed["padding"] == 0.0
    assert speed["tokens_per_second"] > 0
    assert "| clm |" in results["table"] and "| packed |" in results["table"]
