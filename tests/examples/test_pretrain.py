"""Tests of `python -m examples.pretrain`: the batches of each objective,
the masks they train with, the fine-tuning recipe (nested label subsets,
the backbone's smaller step, early stopping), and tiny runs: all three
objectives and the fine-tuning grid (tables, plots, explorer), then
`--finetune-only` on the saved models."""

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


def test_padded_baselines_hold_the_same_targets_with_more_padding(tokenizer):
    # The padded baselines of --pack (`--padding`): length buckets, random
    # batches padded to their longest, every row padded to the window.
    import tensorflow as tf

    from examples.pretrain import data

    texts = TEXTS * 6
    ids = data.encode(tf.data.Dataset.from_tensor_slices(texts), tokenizer, 8)

    def counts(padding):
        batches = data.objective_batches(
            ids, "clm", tokenizer, 4, 8, shuffle=True, padding=padding
        )
        targets = padded = 0
        for x, _, w in batches.as_numpy_iterator():
            rows = x["token_ids"] != 0
            if padding == "window":  # inputs drop the last position
                assert x["token_ids"].shape[1] == 7
            else:  # padded to the longest (inputs drop its last token)
                assert x["token_ids"].shape[1] == rows.sum(axis=1).max()
            targets, padded = targets + w.sum(), padded + rows.size
        return targets, padded

    (t_b, n_b), (t_r, n_r), (t_w, n_w) = map(
        counts, ["buckets", "batch", "window"]
    )
    assert t_b == t_r == t_w > 0
    assert n_b < n_r <= n_w
    with pytest.raises(ValueError, match="padding='none'"):
        data.objective_batches(ids, "clm", tokenizer, 4, 8, True, 0, "none")


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
    results = example_output.quick_run(
        tmp_path_factory, "pretrain", data_dir=True
    )
    results["pretrained_dir"] = os.path.join(
        results["output_dir"], "pretrained"
    )
    return results


def test_quick_run_prints_no_warnings(quick_run):
    # It used to print Keras's "`shuffle=True` was passed, but will be ignored",
    # "Your input ran out of data" (evaluate), "Layer 'mlm_head' (of type
    # MaskedLMHead) was passed an input with a mask attached to it. However,
    # this layer does not support masking" and TFDS's INFO logs.
    output = quick_run["output"]
    assert "fine-tuning on [20, 40]" in output.log  # the run's own messages
    found = output.problems()
    assert not found, "\n".join(found)


def test_quick_run_prints_well_formed_tables_and_plots(quick_run):
    lines = quick_run["pretrain_table"].splitlines()
    assert lines[0].startswith("| objective | pretrain loss (val,")
    assert lines[1] == "|---|---|---|---|---|---|---|"
    for line, objective in zip(lines[2:], ["mlm", "clm", "prefix_lm"]):
        cells = [c.strip() for c in line.split("|")[1:-1]]
        assert cells[0] == objective and len(cells) == 7
        assert re.fullmatch(r"\d+\.\d{3} -> \d+\.\d{3}", cells[1])
        assert re.fullmatch(r"\d+ s", cells[3])
        # padded batches (no --pack): some padding, tokens/s > 0
        assert cells[4] == "padded (length buckets)" and int(cells[5]) > 0
        assert re.fullmatch(r"\d+\.\d %", cells[6])
    for record in quick_run["records"].values():
        curve = record["curve"]
        assert len(curve["steps"]) == len(curve["val_loss"]) > 1
        assert all(np.isfinite(curve["train_loss"] + curve["val_loss"]))
    lines = quick_run["table"].splitlines()
    assert lines[0] == "| model | 20 labels | 40 labels |"
    assert [line.split("|")[1].strip() for line in lines[2:]] == [
        "scratch",
        "mlm",
        "clm",
        "prefix_lm",
    ]
    for line in lines[2:]:
        for cell in line.split("|")[2:-1]:
            assert re.fullmatch(r"\d+\.\d ± \d+\.\d", cell.strip())
    rows = quick_run["rows"]
    assert len(rows) == 4 * 2  # models x label counts (one seed)
    for row in rows:
        assert 0.0 <= row["test_accuracy"] <= 1.0
        assert 1 <= row["best_epoch"] <= row["epochs"]
    output_dir = os.path.dirname(quick_run["explorer"])
    with open(os.path.join(output_dir, "results.md")) as f:
        text = f.read()
    assert quick_run["table"] in text and quick_run["pretrain_table"] in text
    for name in ("pretrain_loss.png", "finetune_curve.png"):
        with open(os.path.join(output_dir, name), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_label_subsets_are_nested_and_seeded():
    from examples.pretrain.finetune import label_subsets

    subsets = label_subsets(1000, [100, 300, 1000, 5000], seed=1)
    assert [len(subsets[n]) for n in (100, 300, 1000, 5000)] == [
        100,
        300,
        1000,
        1000,
    ]
    np.testing.assert_array_equal(subsets[300][:100], subsets[100])
    assert sorted(subsets[1000]) == list(range(1000))
    again = label_subsets(1000, [300], seed=1)
    np.testing.assert_array_equal(again[300], subsets[300])
    other = label_subsets(1000, [300], seed=2)
    assert set(other[300]) != set(subsets[300])


def test_an_epoch_is_one_pass_within_its_step_bounds():
    from examples.pretrain.finetune import Recipe

    recipe = Recipe(batch_size=32, min_epoch_steps=10, max_epoch_steps=200)
    assert recipe.epoch_steps(100) == 10  # 4 batches: the least
    assert recipe.epoch_steps(1000) == 32  # one pass
    assert recipe.epoch_steps(3000) == 94
    assert recipe.epoch_steps(65647) == 200  # validation every 200 steps
    with pytest.raises(ValueError, match="max_epoch_steps=5"):
        Recipe(min_epoch_steps=10, max_epoch_steps=5)


def test_max_epoch_steps_below_an_epochs_least_is_refused(capsys):
    from examples.pretrain import __main__ as pretrain

    with pytest.raises(SystemExit):
        pretrain.parse_args(["--max-epoch-steps", "4"])
    assert "--max-epoch-steps 4" in capsys.readouterr().err


def test_full_reuses_the_default_runs_pretraining():
    from examples.pretrain import __main__ as pretrain

    default, full = pretrain.parse_args([]), pretrain.parse_args(["--full"])
    assert default.label_counts == [100, 300]
    assert full.label_counts == [100, 300, 1000, 3000, None]
    saved = [
        {key: getattr(args, key) for key in pretrain.PRETRAIN_CONFIG}
        for args in (default, full)
    ]
    assert saved[0] == saved[1]  # --full finds the default's models


def test_the_backbone_takes_a_smaller_step_than_the_head():
    import keras

    from examples.pretrain.finetune import LayerwiseAdamW

    backbone = keras.Variable(np.zeros((3,), "float32"), name="backbone")
    head = keras.Variable(np.zeros((3,), "float32"), name="head")
    optimizer = LayerwiseAdamW(
        scaled_variables=[backbone],
        multiplier=0.25,
        learning_rate=0.01,
        weight_decay=0.0,
    )
    gradient = keras.ops.convert_to_tensor(np.array([1.0, -2.0, 3.0]))
    for _ in range(3):
        optimizer.apply_gradients([(gradient, backbone), (gradient, head)])
    step_backbone = keras.ops.convert_to_numpy(backbone)
    step_head = keras.ops.convert_to_numpy(head)
    assert np.all(np.abs(step_head) > 0)
    np.testing.assert_allclose(step_backbone, 0.25 * step_head, rtol=1e-5)


def test_early_stopping_keeps_the_best_validation_weights():
    import keras

    from examples.pretrain.finetune import Recipe
    from examples.pretrain.finetune import fit_classifier

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    x_val = rng.normal(size=(64, 4)).astype("float32")
    y_val = rng.integers(0, 2, 64).astype("int32")  # noise: accuracy jumps
    body = keras.layers.Dense(8, activation="relu")
    head = keras.layers.Dense(2)
    inputs = keras.Input((4,))
    model = keras.Model(inputs, head(body(inputs)))
    recipe = Recipe(
        learning_rate=0.05,
        batch_size=16,
        warmup_steps=1,
        min_epoch_steps=2,
        max_epochs=8,
        patience=3,
    )
    record = fit_classifier(
        model, body.trainable_variables, (x, y), (x_val, y_val), recipe, 0
    )
    assert 1 <= record["best_epoch"] <= record["epochs"] <= 8
    assert record["epochs"] <= record["best_epoch"] + recipe.patience
    metrics = model.evaluate(x_val, y_val, verbose=0, return_dict=True)
    assert metrics["accuracy"] == pytest.approx(record["val_accuracy"])


def test_warmup_cosine_decay_equals_keras_cosine_decay():
    import keras

    from examples.pretrain.finetune import WarmupCosineDecay

    ours = WarmupCosineDecay(2e-3, warmup_steps=30, alpha=0.1)
    for total in (150, 480):
        ours.total_steps.assign(float(total))
        theirs = keras.optimizers.schedules.CosineDecay(
            0.0,
            decay_steps=total - 30,
            alpha=0.1,
            warmup_target=2e-3,
            warmup_steps=30,
        )
        for step in (0, 1, 15, 29, 30, 31, 100, total - 1, total, total + 9):
            np.testing.assert_allclose(
                keras.ops.convert_to_numpy(ours(step)),
                keras.ops.convert_to_numpy(theirs(step)),
                rtol=1e-5,
                atol=1e-9,
                err_msg=f"step {step} of {total}",
            )


def _toy_problem(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(96, 4)).astype("float32")
    return x, (x[:, seed % 4] > 0).astype("int32")


def test_a_runs_result_does_not_depend_on_the_runs_before_it():
    import keras

    from examples.pretrain.finetune import FineTuner
    from examples.pretrain.finetune import Recipe

    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    body = keras.layers.Dense(16, activation="relu")
    hidden = keras.layers.Dropout(0.3)(body(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2)(hidden))
    start = model.get_weights()
    recipe = Recipe(
        learning_rate=0.05,
        batch_size=16,
        warmup_steps=2,
        min_epoch_steps=3,
        max_epochs=4,
        patience=10,
    )
    tuner = FineTuner(model, body.trainable_variables, recipe)

    def run(problem, seed):
        record = tuner.fit(start, problem, problem, seed)
        return record, model.get_weights()

    first, first_weights = run(_toy_problem(0), 0)
    other, other_weights = run(_toy_problem(1), 1)  # other data, seed
    again, again_weights = run(_toy_problem(0), 0)
    assert again == first
    for a, b in zip(first_weights, again_weights):
        np.testing.assert_array_equal(a, b)
    # The runs trained, and the second one elsewhere.
    assert any(np.any(a != b) for a, b in zip(start, first_weights))
    assert any(np.any(a != b) for a, b in zip(first_weights, other_weights))
    # A fresh tuner (a fresh compile) gives the same run.
    fresh = FineTuner(model, body.trainable_variables, recipe)
    assert fresh.fit(start, _toy_problem(0), _toy_problem(0), 0) == first


def test_initial_weights_combine_the_backbone_and_a_seeded_head(quick_run):
    from examples.pretrain import __main__ as pretrain

    args = pretrain.parse_args(
        ["--quick", "--pretrained-dir", quick_run["pretrained_dir"]]
    )
    store = pretrain.PretrainedStore(args.pretrained_dir)
    for key, value in store.config().items():
        setattr(args, key, value)
    initial = pretrain.InitialWeights(args, store.tokenizer(), 25)
    model = initial.classifier(0)
    head = [v.path.startswith(pretrain.HEAD_LAYERS) for v in model.weights]
    assert any(head) and not all(head)

    def same(a, b):
        return all(np.array_equal(x, y) for x, y in zip(a, b))

    scratch = [initial.of("scratch", seed) for seed in (0, 1)]
    assert same(scratch[0], model.get_weights())  # seeded
    assert not same(scratch[0], scratch[1])
    clm = initial.of("clm", 1)
    saved = initial.classifier(0, "clm").get_weights()
    for is_head, ours, fresh, pretrained in zip(head, clm, scratch[1], saved):
        expected = fresh if is_head else pretrained
        np.testing.assert_array_equal(ours, expected)
    mlm = initial.of("mlm", 1)
    assert not same(
        [w for w, h in zip(mlm, head) if not h],
        [w for w, h in zip(clm, head) if not h],
    )


def test_finetune_only_reuses_the_saved_models(quick_run, tmp_path):
    from examples.pretrain import __main__ as pretrain

    with example_output.captured() as output:
        results = pretrain.main(
            [
                "--quick",
                "--finetune-only",
                "--objective",
                "clm",
                "--label-counts",
                "20",
                "--pretrained-dir",
                quick_run["pretrained_dir"],
                "--output-dir",
                str(tmp_path / "run"),
                "--data-dir",
                quick_run["data_dir"],
            ]
        )
    assert not output.problems(), "\n".join(output.problems())
    assert "clm: the saved pretrained model" in output.log
    saved = quick_run["models"]["clm"].get_weights()
    loaded = results["models"]["clm"].get_weights()
    assert len(saved) == len(loaded)
    for a, b in zip(saved, loaded):
        np.testing.assert_array_equal(a, b)
    assert results["records"]["clm"] == quick_run["records"]["clm"]
    assert [r["labels"] for r in results["rows"]] == [20, 20]


def test_finetune_only_without_saved_models_says_so(tmp_path):
    from examples.pretrain import __main__ as pretrain

    with pytest.raises(SystemExit, match="--pretrain-only first"):
        pretrain.main(
            [
                "--quick",
                "--finetune-only",
                "--pretrained-dir",
                str(tmp_path / "none"),
                "--output-dir",
                str(tmp_path / "run"),
            ]
        )


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


def test_quick_packed_clm_run(quick_run, tmp_path):
    # The quick run's TFDS directory: its datasets are prepared already.
    from examples.pretrain import __main__ as pretrain

    with example_output.captured() as output:
        results = pretrain.main(
            [
                "--quick",
                "--objective",
                "clm",
                "--pack",
                "--pretrain-only",
                "--output-dir",
                str(tmp_path / "run"),
                "--data-dir",
                quick_run["data_dir"],
            ]
        )
    assert not output.problems(), "\n".join(output.problems())
    speed = results["records"]["clm"]["throughput"]
    assert speed["packed"] and speed["padding"] == 0.0
    assert speed["tokens_per_second"] > 0
    table = results["pretrain_table"]
    assert "| clm |" in table and "| packed |" in table
    assert results["rows"] == []  # --pretrain-only: no fine-tuning
