"""Converted keras-hub models vs the originals: one training step.

    python benchmarks/interop_training.py [--sizes 512,2048] [--batch 2]
        [--families bert,llama] [--repeats 5] [--markdown F]

A BERT-style (`keras_hub.models.BertBackbone`) and a Llama-style
(`LlamaBackbone`, grouped-query attention, rotary positions, SwiGLU)
backbone (and, with `--families`, Gemma 3: six layers, five windowed to
one global; gpt-oss: windowed and full layers alternating, learned sinks,
4 experts top-2) of the same small size (2 layers, hidden 256, 4 heads — 2
key/value heads for Llama —, feed-forward 1024, vocabulary 1,000, no
dropout: keras-hub's BERT drops out 10 % by default, which would make our
layers take the dense path), random weights, and
`keras_attention.interop.from_keras_hub` of each (a copy of its weights).
One training step: the gradients of `mean(sequence_output ** 2)` with
respect to every weight, applied by SGD, in a `tf.function` (no XLA),
on `batch` sequences of `T` real tokens. Outputs at every position are
compared first (atol 1e-4). Times are medians of interleaved runs after
a warm-up; the peak memory (RSS) of each (model, T) is measured in a
fresh process running three steps. The machine and `os.getloadavg()` are
printed before and after (publish only from an idle machine: 1-minute
load < 0.5).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _timing import load_average  # noqa: E402
from _timing import machine_summary  # noqa: E402
from _timing import markdown_table  # noqa: E402
from _timing import time_interleaved  # noqa: E402
from _timing import try_peak_rss_mb  # noqa: E402

from keras_attention.interop import from_keras_hub  # noqa: E402

VOCAB, LAYERS, HIDDEN, HEADS, FF = 1000, 2, 256, 4, 1024


def backbone(family, max_length):
    keras.utils.set_random_seed(0)
    common = dict(
        vocabulary_size=VOCAB,
        num_layers=LAYERS,
        hidden_dim=HIDDEN,
        intermediate_dim=FF,
        dropout=0.0,
    )
    if family == "bert":
        return keras_hub.models.BertBackbone(
            num_heads=HEADS, max_sequence_length=max_length, **common
        )
    if family == "llama":
        return keras_hub.models.LlamaBackbone(
            num_query_heads=HEADS, num_key_value_heads=2, **common
        )
    if family == "gemma3":
        # Six layers: five windowed (512) to one global, QK-norm,
        # post-norms, a rotary wavelength per kind of layer.
        return keras_hub.models.Gemma3Backbone(
            image_size=None,
            vision_encoder=None,
            num_query_heads=HEADS,
            num_key_value_heads=2,
            head_dim=HIDDEN // HEADS,
            use_sliding_window_attention=True,
            sliding_window_size=512,
            use_post_ffw_norm=True,
            use_post_attention_norm=True,
            **dict(common, num_layers=6),
        )
    if family == "gpt_oss":
        # Alternating windowed (128) and full layers, learned sinks,
        # 4 experts, top-2.
        return keras_hub.models.GptOssBackbone(
            num_query_heads=HEADS,
            num_key_value_heads=2,
            head_dim=HIDDEN // HEADS,
            num_experts=4,
            top_k=2,
            sliding_window=128,
            **common,
        )
    raise ValueError(f"Unknown family {family!r}")


def models(family, max_length):
    theirs = backbone(family, max_length)
    return {"ours": from_keras_hub(theirs), "keras_hub": theirs}


def inputs(family, batch, length):
    rng = np.random.default_rng(1)
    data = {
        "token_ids": rng.integers(1, VOCAB, (batch, length)).astype("int32"),
        "padding_mask": np.ones((batch, length), "int32"),
    }
    if family == "bert":
        data["segment_ids"] = np.zeros((batch, length), "int32")
    return {k: tf.constant(v) for k, v in data.items()}


def sequence_output(model, data, training):
    out = model(data, training=training)
    return out["sequence_output"] if isinstance(out, dict) else out


def make_step(model):
    optimizer = keras.optimizers.SGD(1e-4)
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(data):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(
                tf.square(sequence_output(model, data, training=True))
            )
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    return lambda data: float(step(data))


def child(family, which, length, batch):
    """Three training steps of one model (the peak-memory process)."""
    model = models(family, length)[which]
    step = make_step(model)
    data = inputs(family, batch, length)
    for _ in range(3):
        step(data)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="512,2048")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--families", default="bert,llama")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--markdown")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        family, which, length, batch = args.child
        child(family, which, int(length), int(batch))
        return
    load_before = load_average()
    print(f"Machine: {machine_summary()}", flush=True)
    print(f"Load average before: {load_before}", flush=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for family in args.families.split(","):
        pair = models(family, max(sizes))
        for length in sizes:
            data = inputs(family, args.batch, length)
            outs = {
                k: np.asarray(sequence_output(m, data, False))
                for k, m in pair.items()
            }
            diff = float(np.abs(outs["ours"] - outs["keras_hub"]).max())
            if not diff <= 1e-4:
                raise AssertionError(f"{family} T={length}: outputs differ")
            steps = {k: make_step(m) for k, m in pair.items()}
            times = time_interleaved(
                {k: (lambda f=f: f(data)) for k, f in steps.items()},
                repeats=args.repeats,
                warmup=args.warmup,
            )
            memory = {}
            for which in pair:
                memory[which] = None
                if not args.no_memory:
                    memory[which] = try_peak_rss_mb(
                        [
                            sys.executable,
                            os.path.abspath(__file__),
                            "--child",
                            family,
                            which,
                            length,
                            args.batch,
                        ]
                    )
            row = [
                family,
                length,
                args.batch,
                times["ours"] * 1e3,
                times["keras_hub"] * 1e3,
                times["ours"] / times["keras_hub"],
                memory["ours"],
                memory["keras_hub"],
                (
                    memory["ours"] / memory["keras_hub"]
                    if memory["ours"] and memory["keras_hub"]
                    else None
                ),
                diff,
            ]
            rows.append(row)
            print("  " + " | ".join(map(str, row)), flush=True)
    text = "\n".join(
        [
            f"Machine: {machine_summary()}.",
            f"Load average before: {load_before}; after: {load_average()}.",
            "",
            markdown_table(
                [
                    "family",
                    "T",
                    "batch",
                    "ours ms",
                    "keras_hub ms",
                    "time ours/keras_hub",
                    "ours peak MiB",
                    "keras_hub peak MiB",
                    "memory ours/keras_hub",
                    "max |diff|",
                ],
                rows,
            ),
        ]
    )
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    return rows


if __name__ == "__main__":
    main()
