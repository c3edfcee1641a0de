"""Peak memory of `keras_attention.interop.from_huggingface` while loading
a checkpoint, against the checkpoint's size.

Writes a random Llama checkpoint (`safetensors.numpy.save_file`; the
tensor names and shapes `from_huggingface`'s llama converter reads: 8
layers, hidden size 1024, 16 heads, 4 key/value heads, intermediate
2816, vocabulary 32000, untied head; 153 M parameters, 307 MB in
bfloat16 by default), then loads it in a fresh process and reports that
process's peak resident memory growth (`ru_maxrss` after the load minus
the resident memory just before it: the model's weights and whatever the
loading holds besides) divided by the checkpoint's size. The model
itself is the size of the checkpoint, so 1.0 is the floor; the loader
reads one tensor at a time (no memory map). A second figure starts the
backend's runtime first (a tiny checkpoint loaded in the same process),
leaving out what any first Keras computation costs. One row per backend
(`--backends`, default: `KERAS_BACKEND`'s), each loaded in its own fresh
processes; `--small` writes a checkpoint about 8 times smaller (4 layers,
hidden size 512, vocabulary 16,000: a quick check, whose ratio the
runtime's own start weighs on more).

    KERAS_BACKEND=tensorflow python benchmarks/checkpoint_memory.py \
        [--dtype bfloat16|float32] [--shards N] [--small] \
        [--backends tensorflow,jax,torch] [--markdown FILE]
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

CONFIG = dict(
    model_type="llama",
    vocab_size=32000,
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=4,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)

# The loading process: resident memory before and peak after; with a
# second directory, a tiny checkpoint loaded first (the backend's
# runtime, its thread pools and kernels, started before the measure).
CHILD = """
import json, resource, sys, time
import keras_attention
def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
if len(sys.argv) > 2:
    keras_attention.interop.from_huggingface(sys.argv[2])
before = rss_mb()
start = time.perf_counter()
model = keras_attention.interop.from_huggingface(sys.argv[1])
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"before_mb": before, "peak_mb": peak, "seconds": seconds,
    "weights": len(model.weights)}))
"""


SMALL = dict(
    CONFIG,
    vocab_size=16000,
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
)

TINY = dict(
    CONFIG,
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def tensor_shapes(config=CONFIG):
    """The checkpoint's tensor names and shapes for `config`."""
    h, i = config["hidden_size"], config["intermediate_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    d = h // heads
    shapes = {
        "model.embed_tokens.weight": (config["vocab_size"], h),
        "lm_head.weight": (config["vocab_size"], h),
        "model.norm.weight": (h,),
    }
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes.update(
            {
                p + "self_attn.q_proj.weight": (heads * d, h),
                p + "self_attn.k_proj.weight": (kv * d, h),
                p + "self_attn.v_proj.weight": (kv * d, h),
                p + "self_attn.o_proj.weight": (h, heads * d),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
            }
        )
    return shapes


def write_checkpoint(directory, dtype, shards, config=CONFIG):
    """The random checkpoint in `directory` (`shards` files); its bytes."""
    from safetensors.numpy import save_file

    np_dtype = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    rng = np.random.default_rng(0)
    shapes = tensor_shapes(config)
    names = sorted(shapes)
    weight_map, total = {}, 0
    for k in range(shards):
        part = {}
        for name in names[k::shards]:
            shape = shapes[name]
            value = rng.standard_normal(shape, dtype=np.float32) * 0.02
            part[name] = value.astype(np_dtype)
            total += part[name].nbytes
        file = (
            "model.safetensors"
            if shards == 1
            else f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        )
        save_file(part, str(directory / file))
        weight_map.update({name: file for name in part})
        del part
    if shards > 1:
        index = {"metadata": {}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(
            json.dumps(index)
        )
    (directory / "config.json").write_text(json.dumps(config))
    return total


def _load(backend, *directories):
    result = subprocess.run(
        [sys.executable, "-c", CHILD, *map(str, directories)],
        check=True,
        capture_output=True,
        text=True,
        env=dict(os.environ, KERAS_BACKEND=backend),
    )
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    return figures["peak_mb"] - figures["before_mb"], figures["seconds"]


def measure(dtype="bfloat16", shards=1, backends=None, config=CONFIG):
    """Per backend (default: `KERAS_BACKEND`'s), the peak growth of a
    fresh process, and of one whose backend runtime a tiny checkpoint's
    load started first."""
    backends = backends or [os.environ.get("KERAS_BACKEND", "tensorflow")]
    rows = []
    with tempfile.TemporaryDirectory() as out:
        directory, tiny = pathlib.Path(out) / "big", pathlib.Path(out) / "tiny"
        directory.mkdir()
        tiny.mkdir()
        size = write_checkpoint(directory, dtype, shards, config) / 2**20
        write_checkpoint(tiny, dtype, 1, TINY)
        for backend in backends:
            cold, seconds = _load(backend, directory)
            warm, _ = _load(backend, directory, tiny)
            rows.append(
                {
                    "backend": backend,
                    "parameters": sum(
                        int(np.prod(s)) for s in tensor_shapes(config).values()
                    ),
                    "dtype": dtype,
                    "shards": shards,
                    "checkpoint_mb": size,
                    "peak_growth_mb": cold,
                    "ratio": cold / size,
                    "warm_growth_mb": warm,
                    "warm_ratio": warm / size,
                    "seconds": seconds,
                }
            )
    return rows


def markdown(rows):
    lines = [
        "| checkpoint | shards | size (MiB) | peak RSS growth, fresh "
        "process (MiB) | growth / size | growth / size, runtime started | "
        "load time (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| Llama {r['parameters'] / 1e6:.0f} M, {r['dtype']} "
            f"({r['backend']}) | {r['shards']} | "
            f"{r['checkpoint_mb']:.0f} | {r['peak_growth_mb']:.0f} | "
            f"{r['ratio']:.2f} | {r['warm_ratio']:.2f} | "
            f"{r['seconds']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--small", action="store_true")
    parser.add_argument(
        "--backends", help="comma-separated (default: KERAS_BACKEND's)"
    )
    parser.add_argument("--markdown", metavar="FILE")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    backends = args.backends.split(",") if args.backends else None
    config = SMALL if args.small else CONFIG
    rows = measure(args.dtype, args.shards, backends, config)
    table = markdown(rows)
    print(table, end="")
    for r in rows:
        print(f"{r['backend']}: growth / size {r['ratio']:.2f}")
    print(
        f"load average {load:.2f} before, {os.getloadavg()[0]:.2f} after "
        f"({time.strftime('%Y-%m-%d')})"
    )
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table, encoding="utf-8")


if __name__ == "__main__":
    main()
