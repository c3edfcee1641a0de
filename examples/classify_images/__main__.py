"""Image classification with a vision transformer, and its attention maps.

Default task (offline): scikit-learn's bundled handwritten digits (1,797
images of 8×8 pixels, 10 classes) upscaled to 32×32 and cut into 4×4
patches, classified by a small vision transformer (`[CLS]` token, learned
position embeddings, pre-norm `TransformerEncoderBlock`s). Reports the
held-out test accuracy (printed and in `<output-dir>/metrics.json`) and
draws attention maps on test images as PNGs (`<output-dir>/plots/`): the
`[CLS]` attention of the last block per head (or the `AttentionPooling`
weights) and the attention rollout across all blocks (Abnar & Zuidema,
2020); every attention layer's weights also go to the interactive explorer
(`<output-dir>/attention.html`).

    python -m examples.classify_images              # about a minute
    python -m examples.classify_images --pooling attention
    python -m examples.classify_images --position sincos
    python -m examples.classify_images --model feature_map
    python -m examples.classify_images --dataset fashion_mnist --download

`--model feature_map`: a conv stem, then
`MultiHeadAttention(attention_axes=(1, 2))` over its `(batch, H, W, C)`
feature map (2-D self-attention without reshaping to a sequence), then
`AttentionPooling`.
"""

import argparse
import json
import logging
import os
import time

from examples.common import HelpFormatter
from examples.common import add_training_args
from examples.common import fit
from examples.common import setup_runtime
from examples.common.distributed import evaluate

logger = logging.getLogger("examples")


def parse_args(argv=None):
    from examples.classify_images.data import DATASETS
    from examples.classify_images.data import default_image_size
    from examples.classify_images.model import MODELS
    from examples.classify_images.model import POOLINGS
    from examples.classify_images.model import POSITIONS

    parser = argparse.ArgumentParser(
        prog="python -m examples.classify_images",
        description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    data = parser.add_argument_group("data")
    data.add_argument(
        "--dataset",
        choices=DATASETS,
        default="digits",
        help="digits: scikit-learn's bundled 8×8 digits (offline); "
        "fashion_mnist: through TensorFlow Datasets (prepared in --data-dir, "
        "or fetched with --download)",
    )
    data.add_argument("--data-dir", default=None, help="TFDS data directory")
    data.add_argument(
        "--download", action="store_true", help="let TFDS download the dataset"
    )
    data.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="images are resized to this (default: 32 for digits, 28 for "
        "fashion_mnist)",
    )
    model = parser.add_argument_group("model")
    model.add_argument(
        "--model",
        choices=MODELS,
        default="vit",
        help="vit: patches + transformer encoder blocks; feature_map: conv "
        "stem + MultiHeadAttention(attention_axes=(1, 2)) over the feature "
        "map (needs --pooling attention, its default)",
    )
    model.add_argument(
        "--pooling",
        choices=POOLINGS,
        default=None,
        help="cls: the final [CLS] token; attention: AttentionPooling over "
        "the patches (default: cls for vit, attention for feature_map)",
    )
    model.add_argument(
        "--position",
        choices=POSITIONS,
        default="learned",
        help="learned: PositionEmbedding; sincos: fixed 2-D sine-cosine",
    )
    model.add_argument("--patch-size", type=int, default=4)
    model.add_argument("--hidden-dim", type=int, default=64)
    model.add_argument(
        "--num-layers",
        type=int,
        default=None,
        help="attention blocks (default: 4 for vit, 2 for feature_map)",
    )
    model.add_argument("--num-heads", type=int, default=4)
    model.add_argument("--dropout", type=float, default=0.1)
    model.add_argument(
        "--learning-rate",
        type=float,
        default=2e-3,
        help="peak learning rate (linear warmup over the first epoch, then "
        "cosine decay to 0)",
    )
    model.add_argument(
        "--augment",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="random shifts of up to 1/16 of the image in training",
    )
    parser.add_argument(
        "--num-plots", type=int, default=4, help="attention PNGs"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny data subset and model, a few steps (smoke test)",
    )
    add_training_args(
        parser,
        epochs=40,
        batch_size=64,
        output_dir="runs/classify_images",
        patience=10,
    )
    args = parser.parse_args(argv)
    if args.image_size is None:
        args.image_size = default_image_size(args.dataset)
    if args.pooling is None:
        args.pooling = "cls" if args.model == "vit" else "attention"
    if args.model == "feature_map" and args.pooling != "attention":
        parser.error("--model feature_map pools with --pooling attention")
    if args.num_layers is None:
        args.num_layers = 4 if args.model == "vit" else 2
    if args.quick:
        args.hidden_dim = 16
        args.num_heads = 2
        args.num_layers = 2
        args.num_plots = min(args.num_plots, 2)
        args.epochs = min(args.epochs, 2)
        args.steps_per_epoch = args.steps_per_epoch or 3
    return args


def learning_rate_schedule(args, train_size):
    """Linear warmup over the first epoch to `--learning-rate`, then cosine
    decay to 0 at the last step."""
    import keras

    steps = args.steps_per_epoch or -(-train_size // args.batch_size)
    total = max(args.epochs * steps, 2)
    warmup = min(steps, total // 2)
    return keras.optimizers.schedules.CosineDecay(
        0.0,
        decay_steps=total - warmup,
        warmup_target=args.learning_rate,
        warmup_steps=warmup,
    )


def self_attention_layers(maps, args):
    """The keys of the self-attention layers in `maps`, first first."""
    prefix = "encoder_block_" if args.model == "vit" else "spatial_block_"
    return [
        name
        for name in maps
        if name.startswith(prefix) and maps.metadata[name]["kind"] == "self"
    ]


def draw_attention(model, images, labels, class_names, args):
    """The attention maps of `images` as PNGs, and the explorer.

    Returns `(plots, explorer path, maps)`: `plots` is a list of
    `(path, (width, height))`, `maps` what `image_maps` returns.
    """
    import numpy as np

    from examples.classify_images import attention_maps
    from examples.common import attention_outputs

    grid = (args.image_size // args.patch_size,) * 2
    maps = attention_outputs.collect(model, images)
    cls = args.pooling == "cls"
    drawn = attention_maps.image_maps(
        maps,
        self_attention_layers(maps, args),
        grid,
        pooling_name=None if cls else "pooling",
    )
    predicted = np.argmax(np.asarray(model(images, training=False)), -1)
    plots = []
    for i in range(len(images)):
        caption = (
            f"true: {class_names[labels[i]]} / "
            f"predicted: {class_names[predicted[i]]}"
        )
        plots.append(
            attention_maps.plot_image_attention(
                images[i],
                drawn["heads"][i],
                drawn["rollout"][i],
                os.path.join(args.output_dir, "plots", f"attention_{i}.png"),
                drawn["heads_title"],
                caption,
            )
        )
    tokens = attention_maps.patch_tokens(grid, cls)
    explorer = attention_outputs.write_explorer(
        args.output_dir,
        maps,
        [tokens] * len(images),
        title=f"classify_images ({args.model}, {args.pooling} pooling)",
    )
    return plots, explorer, drawn


def main(argv=None):
    args = parse_args(argv)
    strategy = setup_runtime(args)
    start = time.time()

    import keras

    from examples.classify_images import data
    from examples.classify_images.model import build_model

    splits, class_names = data.load_splits(
        args.dataset,
        args.image_size,
        args.data_dir,
        args.download,
        tiny=args.quick,
    )
    (train_x, train_y), (val_x, val_y), (test_x, test_y) = splits
    logger.info(
        "%s: %d train / %d validation / %d test images of %s, %d classes",
        args.dataset,
        len(train_y),
        len(val_y),
        len(test_y),
        "×".join(map(str, train_x.shape[1:])),
        len(class_names),
    )
    train_batches, val_batches, test_batches = (
        data.batches(x, y, args.batch_size, shuffle, args.seed)
        for x, y, shuffle in (
            (train_x, train_y, True),
            (val_x, val_y, False),
            (test_x, test_y, False),
        )
    )
    with strategy.scope():
        model = build_model(
            args.model,
            pooling=args.pooling,
            image_size=args.image_size,
            num_classes=len(class_names),
            patch_size=args.patch_size,
            hidden_dim=args.hidden_dim,
            num_layers=args.num_layers,
            num_heads=args.num_heads,
            position=args.position,
            dropout=args.dropout,
            channels=train_x.shape[-1],
            augment=args.augment,
        )
        model.compile(
            optimizer=keras.optimizers.AdamW(
                learning_rate_schedule(args, len(train_y)), weight_decay=1e-4
            ),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            jit_compile=args.jit_compile,
        )
    model.summary(print_fn=logger.info)
    history = fit(
        model,
        train_batches,
        val_batches,
        args,
        # The validation loss: less noisy than the accuracy of ~150 images.
        monitor="val_loss",
        mode="min",
        verbose=2,
    )
    # `model.evaluate` fails under several workers (keras#20585).
    test_metrics = evaluate(model, test_batches)
    test_loss, test_accuracy = test_metrics["loss"], test_metrics["accuracy"]
    baseline = data.majority_baseline(train_y, test_y)
    train_time = time.time() - start
    print(
        f"\ntest accuracy: {test_accuracy:.4f} on {len(test_y)} held-out "
        f"images (majority-class baseline {baseline:.4f}), test loss "
        f"{test_loss:.4f}, {train_time / 60:.1f} min"
    )
    metrics = {
        "dataset": args.dataset,
        "model": args.model,
        "pooling": args.pooling,
        "position": args.position,
        "test_accuracy": float(test_accuracy),
        "test_loss": float(test_loss),
        "baseline_accuracy": baseline,
        "test_images": int(len(test_y)),
        "train_images": int(len(train_y)),
        "epochs_run": len(history.history.get("loss", [])),
        "parameters": int(model.count_params()),
        "train_time_s": round(train_time, 1),
        "args": {k: v for k, v in vars(args).items()},
    }
    metrics_path = os.path.join(args.output_dir, "metrics.json")
    with open(metrics_path, "w") as f:
        json.dump(metrics, f, indent=2)
    print(f"metrics: {metrics_path}")

    n = min(args.num_plots, len(test_y))
    plots, explorer, drawn = draw_attention(
        model, test_x[:n], test_y[:n], class_names, args
    )
    print("attention plots:", *(path for path, _ in plots), sep="\n  ")
    print(f"attention explorer: {explorer}")
    return {
        "history": history.history,
        "test_accuracy": float(test_accuracy),
        "baseline_accuracy": baseline,
        "metrics_path": metrics_path,
        "plots": plots,
        "explorer": explorer,
        "maps": drawn,
        "model": model,
        "train_time_s": train_time,
    }


if __name__ == "__main__":
    main()
