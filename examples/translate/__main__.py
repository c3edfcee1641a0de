"""Train an attention encoder-decoder translator and serve it as a SavedModel.

    python -m examples.translate                      # RNN + Bahdanau on dates
    python -m examples.translate --seed 1 --deterministic
    python -m examples.translate --attention luong --score general
    python -m examples.translate --model transformer
    python -m examples.translate --dataset freedict_deu_eng --epochs 20
    python -m examples.translate --dataset ted_hrlr_translate/pt_to_en
    TF_CONFIG=... python -m examples.translate --strategy multiworker

With `--strategy multiworker` (one process per worker, `TF_CONFIG` on
each; see docs/guides/multi-worker.md) the workers train together with a
`strategy.run` loop (Keras's `fit` fails there, keras-team/keras#20585),
`--batch-size` is per replica, only the chief writes `--output-dir`
(checkpoints, TensorBoard, SavedModel, explorer), and a restarted pair
resumes from the shared `--backup-dir`.

The default data are human-written dates in eight languages ("29 novembre
2026", "Sunday, November 29, 2026", "29.11.26") to ISO 8601 ("2026-11-29"),
generated with babel (no network). The run trains with `model.fit` on a
`tf.data` pipeline (teacher forcing), up to `--epochs`: the dates stop
once two epochs have reached 100 % validation exact match, or after
`--patience` epochs without a better one, and keep the best epoch
(`validation.py`; language pairs: the best validation loss). It prints
translations of held-out examples, reports the metric on the held-out
test split (exact match for dates, BLEU via sacrebleu for language
pairs), writes attention heatmaps
(PNG) and an interactive explorer of every attention layer
(`runs/translate/attention.html`) and exports a SavedModel that
translates raw strings (loading it needs `tensorflow_text`, which
registers the tokenizers' ops):

    import tensorflow as tf
    import tensorflow_text  # noqa: F401
    translator = tf.saved_model.load("runs/translate/saved_model")
    translator.translate(tf.constant(["3 janvier 1999"]))
"""

import argparse
import json
import logging
import os
import time

from examples.common import add_training_args
from examples.common import fit
from examples.common import setup_runtime

logger = logging.getLogger("examples")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m examples.translate",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    model = parser.add_argument_group("model")
    model.add_argument("--model", choices=["rnn", "transformer"], default="rnn")
    model.add_argument(
        "--attention",
        choices=["bahdanau", "luong"],
        default="bahdanau",
        help="RNN decoder attention",
    )
    model.add_argument(
        "--score",
        choices=["dot", "general", "concat"],
        default="general",
        help="Luong score function",
    )
    model.add_argument(
        "--alignment",
        choices=["global", "local-m", "local-p"],
        default="global",
        help="Luong alignment",
    )
    model.add_argument(
        "--window",
        type=int,
        default=None,
        help="Luong local alignment half-width D",
    )
    model.add_argument("--embedding-dim", type=int, default=64)
    model.add_argument("--encoder-units", type=int, default=128)
    model.add_argument("--decoder-units", type=int, default=256)
    model.add_argument(
        "--hidden-dim", type=int, default=128, help="transformer width"
    )
    model.add_argument("--num-heads", type=int, default=4)
    model.add_argument("--intermediate-dim", type=int, default=512)
    model.add_argument("--num-layers", type=int, default=2)
    model.add_argument("--dropout", type=float, default=0.1)
    model.add_argument("--learning-rate", type=float, default=2e-3)
    decode = parser.add_argument_group("data and decoding")
    decode.add_argument(
        "--dataset",
        default="multilingual_dates",
        help="multilingual_dates (default), freedict_deu_eng (apt-get "
        "install dict-freedict-deu-eng) or a TFDS translation dataset such "
        "as ted_hrlr_translate/pt_to_en (downloaded by TFDS)",
    )
    decode.add_argument("--data-dir", default=None, help="TFDS data directory")
    decode.add_argument(
        "--vocabulary-size",
        type=int,
        default=8000,
        help="WordPiece vocabulary size (language pairs)",
    )
    decode.add_argument(
        "--decode", choices=["greedy", "beam"], default="greedy"
    )
    decode.add_argument("--beam-size", type=int, default=4)
    decode.add_argument(
        "--num-examples", type=int, default=5, help="translations to print"
    )
    decode.add_argument(
        "--num-plots", type=int, default=3, help="attention heatmaps to write"
    )
    decode.add_argument(
        "--max-eval",
        type=int,
        default=None,
        help="evaluate on the first N test examples (and score the first "
        "N validation examples after every epoch)",
    )
    decode.add_argument(
        "--quick",
        action="store_true",
        help="tiny data and model, a few steps (smoke test)",
    )
    # Up to --epochs; dates stop after 2 epochs at 100 % validation exact
    # match or --patience epochs without a better one (see validation.py).
    add_training_args(
        parser,
        epochs=10,
        batch_size=64,
        output_dir="runs/translate",
        patience=2,
    )
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="TensorFlow's op determinism: the same --seed gives the same "
        "numbers twice on the same machine (without it, the thread order "
        "of TensorFlow's kernels can vary from run to run)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs = min(args.epochs, 2)
        args.steps_per_epoch = args.steps_per_epoch or 15
        args.embedding_dim = args.hidden_dim = 32
        args.encoder_units, args.decoder_units = 32, 64
        args.intermediate_dim, args.num_layers, args.num_heads = 64, 1, 2
        args.max_eval = args.max_eval or 64
    return args


def setup_determinism(args):
    """With `--deterministic`: the seeds again and TensorFlow's op
    determinism (every op picks a deterministic kernel, tf.data keeps its
    order), before any op runs."""
    if not args.deterministic:
        return
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(args.seed)
    tf.config.experimental.enable_op_determinism()
    logger.info("op determinism on (seed %d)", args.seed)


def evaluate(hypotheses, references, metric):
    """Exact match (%) or corpus BLEU (sacrebleu, lowercased)."""
    if metric == "exact_match":
        hits = sum(h == r for h, r in zip(hypotheses, references))
        return 100.0 * hits / max(len(references), 1)
    import sacrebleu

    return sacrebleu.corpus_bleu(hypotheses, [references], lowercase=True).score


def translate_all(serve, sentences, batch_size=256):
    import tensorflow as tf

    out = []
    for i in range(0, len(sentences), batch_size):
        batch = tf.constant(sentences[i : i + batch_size])
        out += [s.decode("utf-8") for s in serve(batch).numpy()]
    return out


def translate_batch(string_translator, sentences):
    """`(source, target)` ids of `sentences`: the sources 0-padded to the
    longest, and the model's greedy (or beam) translations, `[START]`
    first, in one `generate` call."""
    import numpy as np
    import tensorflow as tf

    # One sentence at a time (eager keras_hub tokenizers return lists for
    # ragged batches), then 0-padded to the longest.
    rows = [
        string_translator.tokenize(tf.constant([s])).numpy()[0]
        for s in sentences
    ]
    source = np.zeros((len(rows), max(len(r) for r in rows)), "int32")
    for i, row in enumerate(rows):
        source[i, : len(row)] = row
    target = np.asarray(string_translator.translator.generate(source))
    return source, target


def plot_examples(string_translator, sentences, directory, limit, batch=None):
    """Heatmaps of the cross-attention for the first `limit` sentences
    (`batch`: their `translate_batch`, if already computed)."""
    import numpy as np

    from examples.common.text import id_to_tokens
    from keras_attention.visualization import plot_attention

    os.makedirs(directory, exist_ok=True)
    paths = []
    sentences = sentences[:limit]
    if not sentences:
        return paths
    if batch is None:
        batch = translate_batch(string_translator, sentences)
    sources, targets = batch[0][: len(sentences)], batch[1][: len(sentences)]
    # The padded sources' attention: 0 on the padding (cut off below).
    all_weights = np.asarray(
        string_translator.translator.cross_attention(sources, targets)
    )
    for i, sentence in enumerate(sentences):
        weights = all_weights[i]
        source_ids = [t for t in sources[i] if t != 0]
        target_ids = [t for t in targets[i] if t != 0]
        # Row t holds the attention used to predict token t + 1.
        rows = target_ids[1:]
        path = os.path.join(directory, f"attention_{i}.png")
        plot_attention(
            weights[: len(rows), : len(source_ids)],
            id_to_tokens(string_translator.source_tokenizer, source_ids),
            id_to_tokens(string_translator.target_tokenizer, rows),
            path=path,
            title=sentence,
        )
        paths.append(
            {
                "path": path,
                "source_tokens": len(source_ids),
                "target_tokens": len(rows),
            }
        )
    return paths


def tensorboard_images(data, output_dir, count=3):
    """The `AttentionTensorBoard` callback: every attention layer's
    heatmaps on the first `count` validation pairs (teacher-forced on
    their references) after every epoch, in `<output_dir>/logs/attention`.
    """
    from examples.common import attention_outputs
    from examples.common.text import id_to_tokens

    features, _ = next(iter(data.probe))
    probe = {k: v[:count].numpy() for k, v in features.items()}
    return attention_outputs.tensorboard_images(
        output_dir,
        probe,
        [
            id_to_tokens(data.source_tokenizer, r[r != 0])
            for r in probe["encoder_ids"]
        ],
        target_tokens=[
            id_to_tokens(data.target_tokenizer, r[r != 0])
            for r in probe["decoder_ids"]
        ],
    )


def write_explorer(string_translator, sentences, output_dir, batch=None):
    """Every attention layer of the model (encoder self-attention, decoder
    self- and cross-attention, or the RNN decoder's alignment), teacher-
    forced on the model's own translations of `sentences`, as the
    explorer `<output_dir>/attention.html` (`batch`: their
    `translate_batch`, if already computed)."""
    from examples.common import attention_outputs
    from examples.common.text import id_to_tokens

    if batch is None:
        batch = translate_batch(string_translator, sentences)
    source, target = batch
    target = target[:, :-1]  # the decoder's inputs, as in training
    inputs = {"encoder_ids": source, "decoder_ids": target}
    # Decoder position t reads token t and predicts token t + 1.
    return attention_outputs.model_explorer(
        output_dir,
        string_translator.translator.model,
        inputs,
        [
            id_to_tokens(string_translator.source_tokenizer, r[r != 0])
            for r in source
        ],
        target_tokens=[
            id_to_tokens(string_translator.target_tokenizer, r[r != 0])
            for r in target
        ],
        title="translate: " + type(string_translator.translator).__name__,
    )


def main(argv=None):
    args = parse_args(argv)
    strategy = setup_runtime(args)
    setup_determinism(args)

    import keras
    import tensorflow as tf

    from examples.translate.data import make_pipelines
    from examples.translate.export import StringTranslator
    from examples.translate.export import export
    from examples.translate.model import build_translator
    from examples.translate.validation import ValidationExactMatch

    started = time.time()
    data = make_pipelines(
        args.dataset,
        args.batch_size * strategy.num_replicas_in_sync,
        data_dir=args.data_dir,
        quick=args.quick,
        vocabulary_size=args.vocabulary_size,
        seed=args.seed,
    )
    _, start_id, end_id = data.special_ids
    with strategy.scope():
        translator = build_translator(
            args.model,
            source_vocabulary_size=data.source_tokenizer.vocabulary_size(),
            target_vocabulary_size=data.target_tokenizer.vocabulary_size(),
            max_source_length=data.max_source_length + 1,
            max_target_length=data.max_target_length,
            start_id=start_id,
            end_id=end_id,
            embedding_dim=args.embedding_dim,
            encoder_units=args.encoder_units,
            decoder_units=args.decoder_units,
            attention=args.attention,
            score=args.score,
            alignment=args.alignment,
            window=args.window,
            hidden_dim=args.hidden_dim,
            num_heads=args.num_heads,
            intermediate_dim=args.intermediate_dim,
            num_layers=args.num_layers,
            dropout=args.dropout,
            decode=args.decode,
            beam_size=args.beam_size,
            jit_compile=bool(args.jit_compile),
        )
        model = translator.model
        model.compile(
            optimizer=keras.optimizers.Adam(args.learning_rate, clipnorm=1.0),
            loss=keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, ignore_class=0
            ),
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
            jit_compile=bool(args.jit_compile),
        )
        features, _ = next(iter(data.probe))
        model(features)  # build: the backup restores into existing weights
    model.summary(print_fn=logger.info)
    string_translator = StringTranslator(
        translator,
        data.source_tokenizer,
        data.target_tokenizer,
        data.max_source_length,
    )
    exact_match = None  # language pairs: the best val_loss, as usual
    if data.metric == "exact_match":
        # Stop on what the example reports, keep the best epoch (see
        # validation.py).
        validation = (
            data.validation_pairs[: args.max_eval]
            if args.max_eval
            else data.validation_pairs
        )
        exact_match = ValidationExactMatch(
            lambda: evaluate(
                translate_all(
                    string_translator.translate, [s for s, _ in validation]
                ),
                [t for _, t in validation],
                data.metric,
            ),
            patience=args.patience,
        )
    history = fit(
        model,
        data.train,
        data.validation,
        args,
        monitor="val_loss" if exact_match is None else None,
        callbacks=[tensorboard_images(data, args.output_dir)],
        epoch_metrics=[] if exact_match is None else [exact_match],
    )
    train_seconds = time.time() - started
    pairs = (
        data.test_pairs[: args.max_eval] if args.max_eval else data.test_pairs
    )
    sources = [s for s, _ in pairs]
    references = [t for _, t in pairs]
    hypotheses = translate_all(string_translator.translate, sources)
    score = evaluate(hypotheses, references, data.metric)

    print("\nHeld-out examples:")
    for s, r, h in list(zip(sources, references, hypotheses))[
        : args.num_examples
    ]:
        mark = "ok" if h == r else "  "
        print(f"  {mark} {s!r:45} -> {h!r}  (reference {r!r})")
    metric_name = "exact match" if data.metric == "exact_match" else "BLEU"
    epochs_run = len(history.epoch)
    validation_scores = exact_match.scores if exact_match else []
    print(
        f"\nTest {metric_name}: {score:.2f}"
        f"{' %' if data.metric == 'exact_match' else ''} on "
        f"{len(pairs)} held-out examples ({args.decode} decoding)"
    )
    if validation_scores:
        print(
            f"Trained {epochs_run} epoch{'s' if epochs_run != 1 else ''}, "
            f"kept epoch {exact_match.best_epoch + 1}; validation exact "
            f"match by epoch: "
            f"{', '.join(f'{v:.2f}' for v in validation_scores)} %"
        )

    # The plots' and the explorer's sentences, translated in one call.
    shown = sources[: max(args.num_plots, 1)]
    batch = translate_batch(string_translator, shown)
    plots = plot_examples(
        string_translator,
        sources,
        os.path.join(args.output_dir, "plots"),
        args.num_plots,
        batch,
    )
    print("Attention heatmaps:", *[p["path"] for p in plots], sep="\n  ")
    explorer = write_explorer(string_translator, shown, args.output_dir, batch)
    print(f"Attention explorer: {explorer}")
    path = export(
        string_translator, os.path.join(args.output_dir, "saved_model")
    )
    print(
        f"SavedModel: {path}\n  tf.saved_model.load({path!r})"
        f".translate(tf.constant([{sources[0]!r}]))"
    )

    results = {
        "dataset": args.dataset,
        "model": args.model,
        "attention": args.attention if args.model == "rnn" else None,
        "metric": data.metric,
        "score": score,
        "test_examples": len(pairs),
        "epochs_run": epochs_run,
        "validation_exact_match": validation_scores,
        "best_epoch": (
            exact_match.best_epoch + 1 if validation_scores else None
        ),
        "stop_reason": exact_match.stop_reason if exact_match else None,
        "seed": args.seed,
        "deterministic": args.deterministic,
        "final_loss": history.history["loss"][-1] if history.epoch else None,
        "first_loss": history.history["loss"][0] if history.epoch else None,
        "train_seconds": round(train_seconds, 1),
        "saved_model": path,
        "plots": plots,
        "explorer": explorer,
        "examples": [
            {"source": s, "translation": h}
            for s, h in zip(sources[:8], hypotheses[:8])
        ],
    }
    with open(os.path.join(args.output_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=2, ensure_ascii=False)
    tf.get_logger().setLevel(logging.ERROR)
    return results


if __name__ == "__main__":
    main()
