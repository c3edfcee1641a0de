"""Transformer encoder block, training step: keras_attention vs keras_hub.

    python benchmarks/encoder_block.py [--sizes 128,512] [--jit no|yes|both]
        [--repeats 5] [--markdown F]

`keras_attention.layers.TransformerEncoderBlock` against
`keras_hub.layers.TransformerEncoder` of the same size (hidden 256, 8 heads,
feed-forward 1024, post-norm, relu, no dropout) with copied weights; one
training step (gradients w.r.t. every weight and the input) compiled with
`tf.function` (without `jit_compile` by default, the issue's targets:
ours/keras_hub <= 0.9 at T >= 512, <= 1.0 at T = 128; `--jit yes|both`),
interleaved after warm-up, medians. Outputs and every gradient are compared
first (outputs atol 1e-4, gradients relative 1e-3). Machine, versions and
`os.getloadavg()` are printed before and after (publish only from an idle
machine: 1-minute load < 0.5).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _timing import load_average  # noqa: E402
from _timing import machine_summary  # noqa: E402
from _timing import markdown_table  # noqa: E402
from _timing import time_interleaved  # noqa: E402

from keras_attention.blocks import TransformerEncoderBlock  # noqa: E402

HIDDEN, HEADS, FF = 256, 8, 1024
# keras_hub's weight order differs in the feed-forward part: ours is
# [attention (8), attention norm (2), ff dense (4), ff norm (2)], theirs
# [attention (8), attention norm (2), ff norm (2), ff dense (4)].
HUB_INDEX = list(range(10)) + [12, 13, 14, 15, 10, 11]


def make_layers():
    ours = TransformerEncoderBlock(num_heads=HEADS, intermediate_dim=FF)
    theirs = keras_hub.layers.TransformerEncoder(
        intermediate_dim=FF, num_heads=HEADS, layer_norm_epsilon=1e-5
    )
    x = np.zeros((1, 8, HIDDEN), "float32")
    ours(x)
    theirs(x)
    weights = ours.get_weights()
    hub = [None] * len(weights)
    for i, j in enumerate(HUB_INDEX):
        hub[j] = weights[i]
    theirs.set_weights(hub)
    return ours, theirs


def make_step(layer, jit):
    @tf.function(jit_compile=jit)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(layer(x, training=True) ** 2)
        grads = tape.gradient(loss, [x] + layer.trainable_weights)
        return grads[0], tf.add_n([tf.reduce_sum(g) for g in grads[1:]])

    return lambda x: step(x)[0].numpy()


def gradients(layer, x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(layer(x, training=True) ** 2)
    return tape.gradient(loss, [x] + layer.trainable_weights)


def gradient_difference(ours, theirs, x):
    """Largest difference of the input and weight gradients, relative to
    the largest gradient of that tensor (floored at 1e-3 of the largest
    gradient of all: the key bias's gradient is 0 up to round-off, as the
    softmax ignores a per-query constant). Returns `(difference, name)`."""
    mine, hub = gradients(ours, x), gradients(theirs, x)
    hub = [hub[0]] + [hub[1 + j] for j in HUB_INDEX]
    names = ["input"] + [w.path for w in ours.trainable_weights]
    mine = [np.asarray(a) for a in mine]
    hub = [np.asarray(b) for b in hub]
    largest = max(float(np.max(np.abs(b))) for b in hub)
    worst = (0.0, None)
    for a, b, name in zip(mine, hub, names):
        scale = max(float(np.max(np.abs(b))), 1e-3 * largest, 1e-12)
        worst = max(worst, (float(np.max(np.abs(a - b))) / scale, name))
    return worst


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="128,512")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--jit", choices=["no", "yes", "both"], default="no")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--markdown")
    args = parser.parse_args()
    load_before = load_average()
    print(f"Machine: {machine_summary()}", flush=True)
    print(f"Load average before: {load_before}", flush=True)
    jits = {"no": (False,), "yes": (True,), "both": (False, True)}[args.jit]
    ours, theirs = make_layers()
    rows = []
    for t in [int(s) for s in args.sizes.split(",")]:
        x = tf.constant(
            np.random.default_rng(0).normal(size=(args.batch, t, HIDDEN)),
            "float32",
        )
        diff = float(np.max(np.abs(ours(x).numpy() - theirs(x).numpy())))
        if not diff <= 1e-4:
            raise AssertionError(f"outputs differ by {diff}")
        grad_diff, name = gradient_difference(ours, theirs, x)
        print(f"T={t}: max |output diff| {diff:.1e}, gradients {grad_diff:.1e}")
        if not grad_diff <= 1e-3:
            raise AssertionError(f"gradients of {name} differ by {grad_diff}")
        for jit in jits:
            times = time_interleaved(
                {
                    "ours": lambda f=make_step(ours, jit): f(x),
                    "keras_hub": lambda f=make_step(theirs, jit): f(x),
                },
                repeats=args.repeats,
                warmup=args.warmup,
            )
            rows.append(
                [
                    t,
                    args.batch,
                    "yes" if jit else "no",
                    times["ours"] * 1e3,
                    times["keras_hub"] * 1e3,
                    times["ours"] / times["keras_hub"],
                    diff,
                    grad_diff,
                ]
            )
            print("  " + " | ".join(map(str, rows[-1])), flush=True)
    text = "\n".join(
        [
            f"Machine: {machine_summary()}.",
            f"Load average before: {load_before}; after: {load_average()}.",
            "",
            markdown_table(
                [
                    "T",
                    "batch",
                    "jit_compile",
                    "ours ms",
                    "keras_hub ms",
                    "ours/keras_hub",
                    "max |diff|",
                    "grad rel. diff",
                ],
                rows,
            ),
        ]
    )
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
