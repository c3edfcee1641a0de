"""Training step time on 1 device vs 4 devices with the Keras distribution
API (JAX backend): `DataParallel` and `ModelParallel` with
`keras_attention.distribution.get_layout_map` on a 2x2 mesh.

Each configuration runs in its own process (the device count is fixed
before JAX starts: `XLA_FLAGS=--xla_force_host_platform_device_count=N`
gives N virtual CPU devices). The model is a decoder-only language model
of `TransformerDecoderBlock`s (`--hidden-dim`, `--num-layers`, 4 heads),
trained with `train_on_batch` on random token windows; the median step
time after warm-up steps is reported. On one CPU the 4 virtual devices
share the same cores: no speed-up is expected; the point is what the
distribution costs, and that the same program scales on real devices.

    python benchmarks/distribution_steps.py [--steps 20] [--markdown FILE]
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _timing import load_average  # noqa: E402
from _timing import machine_summary  # noqa: E402
from _timing import markdown_table  # noqa: E402

CONFIGS = (("1 device", 1, "none"), ("4 devices", 4, "data"))
CONFIGS += (("4 devices (2x2 mesh)", 4, "model"),)


def child(args):
    import keras
    import numpy as np

    from keras_attention.blocks import TransformerDecoderBlock
    from keras_attention.distribution import get_layout_map

    devices = keras.distribution.list_devices()
    if args.child == "data":
        keras.distribution.set_distribution(
            keras.distribution.DataParallel(devices=devices)
        )
    elif args.child == "model":
        mesh = keras.distribution.DeviceMesh(
            (len(devices) // 2, 2), ("batch", "model"), devices
        )
        keras.distribution.set_distribution(
            keras.distribution.ModelParallel(
                layout_map=get_layout_map(mesh), batch_dim_name="batch"
            )
        )
    keras.utils.set_random_seed(0)
    vocab = 128
    ids = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(vocab, args.hidden_dim)(ids)
    for _ in range(args.num_layers):
        x = TransformerDecoderBlock(
            4,
            4 * args.hidden_dim,
            cross_attention=False,
            norm_first=True,
            rotary_max_wavelength=10_000,
        )(x)
    model = keras.Model(ids, keras.layers.Dense(vocab)(x))
    model.compile(
        keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab, (args.batch_size, args.length + 1))
    tokens = tokens.astype("int32")
    x, y = tokens[:, :-1], tokens[:, 1:]
    for _ in range(3):  # compile and warm up
        model.train_on_batch(x, y)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        float(model.train_on_batch(x, y))  # blocks until done
        times.append(time.perf_counter() - start)
    print(
        "RESULT "
        + json.dumps(
            {
                "devices": len(devices),
                "ms": 1000 * float(np.median(times)),
            }
        )
    )


def run(config, args):
    name, devices, kind = config
    env = dict(
        os.environ,
        KERAS_BACKEND="jax",
        TF_CPP_MIN_LOG_LEVEL="3",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        PYTHONPATH=os.path.dirname(HERE),
    )
    command = [sys.executable, __file__, "--child", kind]
    for flag in ("steps", "batch_size", "length", "hidden_dim", "num_layers"):
        command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    out = subprocess.run(
        command, capture_output=True, text=True, env=env, check=True
    )
    (line,) = [s for s in out.stdout.splitlines() if s.startswith("RESULT ")]
    result = json.loads(line[len("RESULT ") :])
    return [name, kind, result["devices"], f"{result['ms']:.1f}"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--hidden-dim", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--markdown", default=None, help="also write here")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    print(machine_summary())
    print("load before:", load_average())
    rows = [run(config, args) for config in CONFIGS]
    print("load after:", load_average())
    table = markdown_table(
        ["configuration", "distribution", "devices", "ms/step (median)"],
        rows,
    )
    header = (
        f"Training step, batch {args.batch_size} x {args.length} tokens, "
        f"{args.num_layers} blocks of width {args.hidden_dim}, JAX on CPU:"
    )
    print(header + "\n\n" + table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(header + "\n\n" + table + "\n")


if __name__ == "__main__":
    main()
