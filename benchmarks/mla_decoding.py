"""Multi-head latent attention decoding: cache bytes and absorbed vs naive.

    python benchmarks/mla_decoding.py                  # TensorFlow
    KERAS_BACKEND=jax python benchmarks/mla_decoding.py
    ... --cache-length 8192 --repeats 15 --markdown out.md
    python benchmarks/mla_decoding.py --quick          # tiny, a few seconds

`MultiHeadLatentAttention` at DeepSeek-V2-Lite's attention sizes by
default (hidden 2,048, 16 heads, `kv_lora_rank` 512, `qk_rope_head_dim`
64, `qk_nope_head_dim` 128, `v_head_dim` 128, no query LoRA), batch 1.
Two tables:

- cache: bytes per token per layer, measured from the cache tensor a
  cached call returns (its size over batch and length), against
  `(kv_lora_rank + qk_rope_head_dim) * dtype size`, and the ratio to the
  cache of a `MultiHeadAttention` of the same heads and key width
  (`key_dim = qk_nope_head_dim + qk_rope_head_dim`, keys and values:
  `2 * heads * key_dim` numbers per token), per dtype;
- decode: one query step (the last slot of a `--cache-length` cache
  filled with random latents, causal) in the absorbed form
  (`absorb=True`: attention over the latents, one shared key/value head)
  and the naive one (`absorb=False`: every head's keys and values
  up-projected from the whole cache at each step), same weights: median
  milliseconds per token (batch 1: per step, the cache write included)
  and the ratio naive / absorbed. Both are checked to give the same
  output first.

TensorFlow steps run under `tf.function` (`--jit` for XLA), JAX steps
under `jax.jit` (`stateless_call`), PyTorch eagerly. The timings are
interleaved after warm-up (`benchmarks/_timing.py`); the load average is
printed before and after: publish only from an idle machine.
"""

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _timing import load_average  # noqa: E402
from _timing import machine_summary  # noqa: E402
from _timing import markdown_table  # noqa: E402
from _timing import time_interleaved  # noqa: E402

import keras_attention as ka  # noqa: E402

BACKEND = keras.backend.backend()
# DeepSeek-V2-Lite's attention; --quick: tiny sizes for a smoke run.
DEFAULT = dict(
    hidden=2048, heads=16, rank=512, rope=64, nope=128, value=128, length=8192
)
QUICK = dict(hidden=32, heads=2, rank=16, rope=4, nope=8, value=8, length=64)


def _mla(sizes, dtype="float32", absorb=None):
    layer = ka.layers.MultiHeadLatentAttention(
        num_heads=sizes["heads"],
        kv_lora_rank=sizes["rank"],
        qk_nope_head_dim=sizes["nope"],
        qk_rope_head_dim=sizes["rope"],
        v_head_dim=sizes["value"],
        absorb=absorb,
        dtype=dtype,
    )
    layer.build((1, None, sizes["hidden"]))
    return layer


def _itemsize(dtype):
    """Bytes per number of a float dtype ("bfloat16" -> 2)."""
    name = keras.backend.standardize_dtype(dtype)
    return int(re.search(r"(\d+)$", name).group(1)) // 8


def _bytes_per_token(cache, length):
    """Bytes of one token in one layer: the cache tensor's size (numbers
    times its dtype's size) over its batch (1) and `length` positions."""
    numbers = int(np.prod(keras.ops.shape(cache)))
    return numbers * _itemsize(cache.dtype) / length


def cache_rows(sizes, dtypes, length=16):
    """Bytes per token per layer, MLA against `MultiHeadAttention`, from
    the caches a cached call of each returns (`length` positions)."""
    rows = []
    key_dim = sizes["nope"] + sizes["rope"]
    for dtype in dtypes:
        x = keras.ops.zeros((1, 1, sizes["hidden"]), dtype)
        mla = _mla(sizes, dtype)
        _, cache = mla(
            x,
            cache=keras.ops.zeros((1, length, mla.cache_dim), dtype),
            cache_update_index=0,
        )
        ours = _bytes_per_token(cache, length)
        expected = mla.cache_dim * _itemsize(dtype)
        if ours != expected:
            raise AssertionError(
                f"MLA cache: {ours} bytes per token, expected "
                f"(kv_lora_rank + qk_rope_head_dim) * itemsize = {expected}"
            )
        mha = ka.layers.MultiHeadAttention(sizes["heads"], key_dim, dtype=dtype)
        shape = (1, 2, length, sizes["heads"], key_dim)
        _, mha_cache = mha(
            x, x, cache=keras.ops.zeros(shape, dtype), cache_update_index=0
        )
        theirs = _bytes_per_token(mha_cache, length)
        rows.append([dtype, int(ours), int(theirs), f"{theirs / ours:.1f}x"])
    return rows


def _compiled_step(layer, jit):
    """`step(x, cache, index)` -> the output as NumPy, compiled per
    backend (the new cache is computed and dropped)."""

    def call(x, cache, index):
        return layer(
            x, cache=cache, cache_update_index=index, use_causal_mask=True
        )[0]

    if BACKEND == "jax":
        import jax

        def pure(values, others, x, cache, index):
            (out, _), _ = layer.stateless_call(
                values,
                others,
                x,
                cache=cache,
                cache_update_index=index,
                use_causal_mask=True,
            )
            return out

        jitted = jax.jit(pure)
        values = [w.value for w in layer.trainable_variables]
        others = [w.value for w in layer.non_trainable_variables]
        return lambda x, cache, index: np.asarray(
            jitted(values, others, x, cache, index)
        )
    if BACKEND == "torch":
        import torch

        def step(x, cache, index):
            with torch.no_grad():
                return keras.ops.convert_to_numpy(call(x, cache, index))

        return step
    import tensorflow as tf

    compiled = tf.function(call, jit_compile=bool(jit))
    return lambda x, cache, index: compiled(x, cache, index).numpy()


def decode_rows(sizes, repeats, warmup, jit):
    """Milliseconds per decoded token, absorbed and naive, at the
    configured cache length (one query step at its last slot)."""
    length = sizes["length"]
    absorbed = _mla(sizes, absorb=True)
    naive = _mla(sizes, absorb=False)
    naive.set_weights(absorbed.get_weights())
    rng = np.random.default_rng(0)
    x = keras.ops.convert_to_tensor(
        rng.normal(size=(1, 1, sizes["hidden"])).astype("float32")
    )
    cache = keras.ops.convert_to_tensor(
        rng.normal(size=(1, length, absorbed.cache_dim)).astype("float32")
    )
    index = keras.ops.convert_to_tensor(length - 1, "int32")
    steps = {
        "absorbed": _compiled_step(absorbed, jit),
        "naive": _compiled_step(naive, jit),
    }
    a, b = (steps[n](x, cache, index) for n in ("absorbed", "naive"))
    scale = max(float(np.max(np.abs(b))), 1e-6)
    if not np.allclose(a, b, atol=1e-4 * scale, rtol=1e-3):
        raise AssertionError(
            "absorbed and naive decoding differ: max difference "
            f"{float(np.max(np.abs(a - b)))}"
        )
    fns = {n: (lambda s=s: s(x, cache, index)) for n, s in steps.items()}
    times = time_interleaved(fns, repeats=repeats, warmup=warmup)
    return [
        [
            length,
            f"{times['absorbed'] * 1e3:.3f}",
            f"{times['naive'] * 1e3:.3f}",
            f"{times['naive'] / times['absorbed']:.2f}x",
        ]
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache-length", type=int, default=None)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--jit", action="store_true", help="TF: XLA")
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args(argv)
    sizes = dict(QUICK if args.quick else DEFAULT)
    if args.cache_length is not None:
        sizes["length"] = args.cache_length
    lines = [
        machine_summary(),
        f"Load average before: {load_average()}",
        f"\nSizes: {sizes}\n",
    ]
    print("\n".join(lines), flush=True)
    cache = markdown_table(
        ["dtype", "MLA bytes/token/layer", "MHA bytes/token/layer", "MHA/MLA"],
        cache_rows(sizes, args.dtypes.split(",")),
    )
    lines += ["cache (bytes per token per layer):\n", cache]
    print(lines[-2] + lines[-1], flush=True)
    compiled = {"tensorflow": "tf.function", "jax": "jax.jit"}
    how = compiled.get(BACKEND, "eager")
    how += " + XLA" if args.jit and BACKEND == "tensorflow" else ""
    decode = markdown_table(
        [
            "cache length",
            "absorbed ms/token",
            "naive ms/token",
            "naive/absorbed",
        ],
        decode_rows(sizes, args.repeats, args.warmup, args.jit),
    )
    lines += [f"\ndecode ({BACKEND}, {how}, batch 1, float32):\n", decode]
    print(lines[-2] + lines[-1], flush=True)
    lines.append(f"\nLoad average after: {load_average()}")
    print(lines[-1])
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return lines


if __name__ == "__main__":
    main()
