"""Programmable attention: block sparsity and the cost of a score function.

    python benchmarks/programmable_attention.py                # TensorFlow
    python benchmarks/programmable_attention.py --markdown out.md
    python benchmarks/programmable_attention.py --tables flex  # PyTorch

Three tables, one training step each (gradients w.r.t. the input and
every weight, `tf.function` without `jit_compile`), 8 heads of 32, timed
interleaved after warm-up (medians), peak memory (RSS) per configuration
in a fresh process:

1. Packed documents: `--documents` equal documents in `--length` tokens
   (default 8 in 8,192, batch 1), a document mask from per-token segment
   ids (`mods.DocumentMask()`, bound at call time through `mod_inputs`):
   our layer on its automatic (blockwise) path, which skips the tiles
   between documents; the same layer and mask forced onto the dense path;
   `keras.layers.MultiHeadAttention` with the equivalent dense
   `(b, T, T)` `attention_mask`. Targets: blockwise >= 4x faster than
   dense and >= 3x faster than Keras, peak memory <= 1/5 of Keras's.
2. A score function (a learned per-head linear bias of the distance, a
   `mods.ScoreLayer`) against the same layer without it, both blockwise,
   T = `--score-length` (2,048), batch 4. Target: <= 1.3x.
3. Peak memory of one causal training step with that score function at
   T = 32,768, batch 1. Target: <= 4 GiB.

4. The variants of `keras_attention.scores` (ALiBi, T5 relative bias,
   soft-cap 50) against the plain blockwise step, causal, T =
   `--score-length`, batch 4 (target <= 1.3x), and peak memory of causal
   training steps: ALiBi at T = `--variant-memory-length` (32,768; target
   <= 4 GiB), and at T = `--keras-hub-length` (8,192) ours plain, ours
   with ALiBi and Keras's layer with keras-hub's `AlibiBias` (dense
   bias) as the reference row.

5. `--tables flex` (PyTorch backend, its own process): inference
   forward (`torch.no_grad()`), batch 1, 4 heads of 64, float32, at
   T = `--flex-lengths` (2,048 and 8,192): causal, a causal sliding
   window of 512 keys, a causal document mask (`--documents` documents),
   ALiBi, soft-capping (50) and T5's bias (causal). Timed interleaved in
   one process: ours (`keras_attention.ops.dot_product_attention`, the
   automatic choice: FlexAttention or SDPA), `flex_attention` compiled
   and called directly (its own `create_block_mask` and `score_mod`),
   the same call on the `(b, h, T, d)` views of our `(b, T, h, d)`
   tensors (read strided: what the flex path copies the query and keys
   to avoid; not a reference), SDPA with the dense mask (an additive
   float mask for the score functions; none for soft-capping, which is
   no bias), our previous path (the automatic choice without
   FlexAttention: SDPA through the fused path, or the blockwise path for
   a score function). Ratios are to ours; `max |diff|` of each output
   from ours. Compiling the FlexAttention kernels (once per shape and
   function) is not timed.
   Targets (issue 57): ours within 1.1x of the faster of flex_attention
   and SDPA; document mask at 8k >= 4x, window 512 at 8k >= 3x faster
   than SDPA with the dense mask. `--flex-cases` runs some of the cases
   (`FLEX_CASES`).

6. `--tables thresholds` (PyTorch, its own process; not in the
   default set): the crossovers the automatic choice's constants stand
   for. `RELATIVE_SDPA_MIN_DENSITY` (measured by the automatic choice
   itself unless pinned; the measured value is printed): ALiBi with
   causal sliding windows of
   `--threshold-windows` keys at T = `--threshold-length`, the
   "relative_sdpa" path (SDPA, every block) against "flex" (the blocks
   outside the window skipped), by the share of (query, key) pairs
   attended. `FLEX_MIN_LENGTH`: "flex" against the path the automatic
   choice takes without it, at T = `--threshold-lengths`, for a causal
   document mask and soft-capping (the first flex call, compilation
   included, reported apart).

Ours is timed interleaved with each alternative of table 1 in its own
process (two dense 8 x T^2 training steps do not fit in one 24 GiB process
at T = 8,192); `--tables documents,score,memory` runs a subset.

Run on an idle machine (the load average is printed before and after).
"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _timing import load_average  # noqa: E402
from _timing import machine_summary  # noqa: E402
from _timing import markdown_table  # noqa: E402
from _timing import time_interleaved  # noqa: E402
from _timing import try_peak_rss_mb  # noqa: E402
from keras import ops  # noqa: E402

import keras_attention  # noqa: E402
from keras_attention import mods  # noqa: E402

HEADS, KEY_DIM = 8, 32
WIDTH = HEADS * KEY_DIM


@keras.saving.register_keras_serializable(package="benchmarks")
class DistanceBias(mods.ScoreLayer):
    """`score - slope[head] * |q - kv|` with a learned slope per head."""

    def build(self, num_heads=None):
        self.slopes = self.add_weight(
            shape=(num_heads,),
            initializer=keras.initializers.Constant(0.01),
            name="slopes",
        )
        self.built = True

    def score_fn(self, score, batch, head, q_idx, kv_idx):
        distance = ops.cast(ops.abs(q_idx - kv_idx), "float32")
        return score - ops.take(self.slopes, head) * distance


def segment_ids(length, documents, batch):
    size = length // documents
    ids = np.minimum(np.arange(length) // size, documents - 1)
    return np.broadcast_to(ids, (batch, length)).astype("int32")


def make_step(layer, call):
    """A `tf.function` training step: input gradient as NumPy."""
    import tensorflow as tf

    @tf.function(reduce_retracing=True)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = call(layer, x)
            loss = tf.reduce_sum(tf.cast(y, "float32") ** 2)
        grads = tape.gradient(loss, [x] + layer.trainable_weights)
        return grads[0], tf.add_n([tf.reduce_sum(g) for g in grads[1:]])

    return lambda x: step(x)[0].numpy()


def document_configs(ids):
    """name -> (layer, call) of the packed-documents table."""
    dense_mask = ids[:, :, None] == ids[:, None, :]
    ours = keras_attention.layers.MultiHeadAttention(
        HEADS, KEY_DIM, mask_mod=mods.DocumentMask()
    )
    theirs = keras.layers.MultiHeadAttention(HEADS, KEY_DIM)

    def ours_call(layer, x):
        return layer(x, x, mod_inputs={"segment_ids": ids})

    def dense_call(layer, x):
        with keras_attention.ops.implementation_scope("dense"):
            return layer(x, x, mod_inputs={"segment_ids": ids})

    def keras_call(layer, x):
        return layer(x, x, attention_mask=dense_mask)

    return {
        "ours (blockwise, tiles skipped)": (ours, ours_call),
        "ours, dense path": (ours, dense_call),
        "keras MultiHeadAttention": (theirs, keras_call),
    }


def score_configs():
    plain = keras_attention.layers.MultiHeadAttention(HEADS, KEY_DIM)
    biased = keras_attention.layers.MultiHeadAttention(
        HEADS, KEY_DIM, score_mod=DistanceBias()
    )

    def call(layer, x):
        with keras_attention.ops.implementation_scope("blockwise"):
            return layer(x, x)

    return {
        "no score function": (plain, call),
        "score function": (biased, call),
    }


def variant_configs():
    """The variants of `keras_attention.scores`, causal, blockwise."""
    from keras_attention import scores

    made = {
        "plain": None,
        "ALiBi": scores.ALiBi(),
        "T5 relative bias": scores.T5RelativeBias(),
        "soft-cap 50": scores.SoftCap(50.0),
    }

    def call(layer, x):
        with keras_attention.ops.implementation_scope("blockwise"):
            return layer(x, x, use_causal_mask=True)

    return {
        name: (
            keras_attention.layers.MultiHeadAttention(
                HEADS, KEY_DIM, score_mod=score
            ),
            call,
        )
        for name, score in made.items()
    }


class KerasHubAlibi(keras.layers.MultiHeadAttention):
    """Keras's layer with keras-hub's `AlibiBias` added to its scores
    (the reference row: a dense `(b, h, T, T)` bias)."""

    def __init__(self, *args, **kwargs):
        import keras_hub

        super().__init__(*args, **kwargs)
        self._alibi = keras_hub.layers.AlibiBias()

    def _compute_attention(
        self,
        query,
        key,
        value,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
        use_causal_mask=False,
    ):
        scale = 1.0 / np.sqrt(KEY_DIM)
        s = ops.einsum("bqhd,bkhd->bhqk", query * scale, key)
        s = self._alibi(s)
        t = ops.shape(s)[-1]
        causal = ops.tril(ops.ones((t, t), "bool"))
        s = ops.where(causal, s, -1e9)
        p = ops.softmax(s, axis=-1)
        return ops.einsum("bhqk,bkhd->bqhd", p, value), None


FLEX_HEADS, FLEX_DIM = 4, 64
FLEX_CASES = ("causal", "window 512", "documents", "ALiBi", "soft-cap 50", "T5")


def flex_configs(length, documents, cases=FLEX_CASES):
    """case -> `{name: forward()}` of the flex table (PyTorch backend),
    for `cases` (of `FLEX_CASES`): ours, flex_attention directly, SDPA
    with the dense mask, our previous path; and the inputs' shapes. Each
    call blocks (CPU)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_block_mask
    from torch.nn.attention.flex_attention import flex_attention

    from keras_attention import scores
    from keras_attention.ops import paths

    flex = torch.compile(flex_attention, dynamic=False)
    gen = torch.Generator().manual_seed(length)
    shape = (1, length, FLEX_HEADS, FLEX_DIM)
    q, k, v = (torch.randn(shape, generator=gen) for _ in range(3))
    # Each in its own layout: ours (b, T, h, d), the kernels (b, h, T, d).
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    ids_np = segment_ids(length, documents, 1)
    ids = torch.as_tensor(ids_np)
    i = torch.arange(length)
    causal = i[:, None] >= i[None, :]
    alibi = scores.ALiBi(num_heads=FLEX_HEADS)
    t5 = scores.T5RelativeBias(bidirectional=False, num_heads=FLEX_HEADS)
    t5.build(FLEX_HEADS)
    slopes = torch.as_tensor(alibi.slopes)
    distance = torch.arange(-(length - 1), length, dtype=torch.int32)
    t5_table = t5.relative_bias(distance).detach()  # (h, 2T - 1)

    def causal_fn(b, h, qi, ki):
        return qi >= ki

    def window_fn(b, h, qi, ki):
        return (qi >= ki) & (qi - ki < 512)

    def documents_fn(b, h, qi, ki):
        return (ids[b, qi] == ids[b, ki]) & (qi >= ki)

    def alibi_fn(s, b, h, qi, ki):
        return s - slopes[h] * (qi - ki)

    def cap_fn(s, b, h, qi, ki):
        return 50.0 * torch.tanh(s / 50.0)

    def t5_fn(s, b, h, qi, ki):
        return s + t5_table[h, qi - ki + length - 1]

    d = (i[:, None] - i[None, :]).clamp(min=-(length - 1))
    configs = {
        "causal": (dict(causal=True), causal_fn, None, causal),
        "window 512": (
            dict(mask_mod=mods.SlidingWindowMask(511, causal=True)),
            window_fn,
            None,
            causal & (i[:, None] - i[None, :] < 512),
        ),
        "documents": (
            dict(
                mask_mod=mods.and_masks(
                    mods.CausalMask(),
                    mods.DocumentMask().bind(segment_ids=ids_np),
                )
            ),
            documents_fn,
            None,
            causal & (ids[0][:, None] == ids[0][None, :]),
        ),
        "ALiBi": (
            dict(causal=True, score_mod=alibi),
            causal_fn,
            alibi_fn,
            -slopes[:, None, None] * d[None].float(),
        ),
        "soft-cap 50": (
            dict(causal=True, score_mod=scores.SoftCap(50.0)),
            causal_fn,
            cap_fn,
            None,
        ),
        "T5": (
            dict(causal=True, score_mod=t5),
            causal_fn,
            t5_fn,
            t5_table[:, d + length - 1],
        ),
    }
    out = {}
    for case in cases:
        kwargs, mask_fn, score_fn, dense = configs[case]
        block_mask = create_block_mask(mask_fn, None, None, length, length)
        small_mask = create_block_mask(
            mask_fn, None, None, length, length, BLOCK_SIZE=64
        )
        if dense is not None and dense.dtype != torch.bool:
            # A bias: add the causal mask as -inf (SDPA's float mask).
            dense = dense.masked_fill(~causal, float("-inf"))[None]
        request = paths.AttentionRequest(
            q, k, v, scale=1.0 / FLEX_DIM**0.5, **kwargs
        )
        previous = paths.automatic(request, flex_ok=False)

        def ours(kwargs=kwargs):
            return keras_attention.ops.dot_product_attention(q, k, v, **kwargs)

        def direct(score_fn=score_fn, block_mask=block_mask):
            out = flex(qt, kt, vt, score_mod=score_fn, block_mask=block_mask)
            return out.transpose(1, 2)

        def sdpa(dense=dense):
            out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=dense)
            return out.transpose(1, 2)

        def before(kwargs=kwargs, previous=previous):
            return keras_attention.ops.dot_product_attention(
                q, k, v, implementation=previous, **kwargs
            )

        def views(score_fn=score_fn, block_mask=block_mask):
            # Our layout's (b, h, T, d) views, read strided (the cost of
            # the copies the flex path makes instead).
            q_, k_, v_ = (x.transpose(1, 2) for x in (q, k, v))
            out = flex(q_, k_, v_, score_mod=score_fn, block_mask=block_mask)
            return out.transpose(1, 2)

        def small(score_fn=score_fn, block_mask=small_mask):
            # Blocks of 64 (ours takes them on a CPU for some masks:
            # `_backend_flex.FLEX_SMALL_BLOCK_WORK`).
            return direct(score_fn, block_mask)

        fns = {"ours": ours, "flex_attention": direct}
        fns["flex_attention, blocks of 64"] = small
        if case != "causal":
            fns["flex_attention, (b, T, h, d) views"] = views
        if dense is not None:
            fns["SDPA, dense mask"] = sdpa
        fns[f"ours before ({previous})"] = before
        out[case] = fns
    return out


def flex_child(lengths, documents, repeats, cases=FLEX_CASES):
    """The flex table (PyTorch backend): rows `[T, case, name, ms, x
    ours, max |diff|, ours' path]`, printed as JSON."""
    import torch
    import torch._dynamo

    from keras_attention.ops import paths

    # One kernel per case and length for flex_attention called directly
    # (the default limit, 8, would run the others eagerly).
    torch._dynamo.config.recompile_limit = 64
    chosen = {}
    original = paths.choose

    def spy(request, name=None):
        path = original(request, name)
        if name is None and paths.current_scope().name is None:
            chosen["path"] = path  # The automatic choice (ours).
        return path

    paths.choose = spy
    rows = []
    with torch.no_grad():
        for length in lengths:
            configs = flex_configs(length, documents, cases)
            for case, fns in configs.items():
                outs = {n: f() for n, f in fns.items()}  # Compiles.
                path = chosen["path"]
                times = time_interleaved(fns, repeats=repeats, warmup=1)
                for name, seconds in times.items():
                    diff = float((outs[name] - outs["ours"]).abs().max())
                    rows.append(
                        [
                            length,
                            case,
                            name,
                            seconds * 1e3,
                            seconds / times["ours"],
                            diff,
                            path if name == "ours" else "",
                        ]
                    )
    paths.choose = original
    print(json.dumps(rows))


def thresholds_child(length, lengths, windows, documents, repeats):
    """The crossovers behind the automatic choice's constants (PyTorch,
    inference forward, batch 1, `FLEX_HEADS` heads of `FLEX_DIM`), rows
    printed as JSON:

    - `["density", T, window, share of pairs attended, relative_sdpa
      ms, flex ms, flex / relative_sdpa]`: ALiBi with a causal sliding
      window (`RELATIVE_SDPA_MIN_DENSITY`: relative_sdpa from the density
      where flex stops being faster);
    - `["length", T, case, flex ms, other ms, flex / other, other path,
      first flex call s]`: a causal document mask and soft-capping (50)
      against the path the automatic choice takes without FlexAttention
      (`FLEX_MIN_LENGTH`: flex from the length where it is faster; the
      first call's compilation is the last column, not in the ratio)."""
    import torch
    import torch._dynamo

    from keras_attention import scores
    from keras_attention.ops import paths
    from keras_attention.ops import relative_sdpa

    torch._dynamo.config.recompile_limit = 64
    rows = []

    def inputs(t):
        gen = torch.Generator().manual_seed(t)
        shape = (1, t, FLEX_HEADS, FLEX_DIM)
        return [torch.randn(shape, generator=gen) for _ in range(3)]

    with torch.no_grad():
        q, k, v = inputs(length)
        alibi = scores.ALiBi(num_heads=FLEX_HEADS)
        for window in windows:
            kwargs = dict(causal=True, score_mod=alibi)
            if window < length:
                kwargs["mask_mod"] = mods.SlidingWindowMask(
                    window - 1, causal=True
                )
            request = paths.AttentionRequest(
                q, k, v, scale=1.0 / FLEX_DIM**0.5, **kwargs
            )
            fns = {
                impl: lambda impl=impl, r=request: paths.run_path(impl, r)
                for impl in ("relative_sdpa", "flex")
            }
            for fn in fns.values():
                fn()  # Compiles.
            times = time_interleaved(fns, repeats=repeats, warmup=1)
            w = min(window, length)
            pairs = w * length - w * (w - 1) // 2  # Causal, w keys.
            sdpa, flex = times["relative_sdpa"], times["flex"]
            density = pairs / length**2
            rows.append(
                ["density", length, window, density, sdpa * 1e3]
                + [flex * 1e3, flex / sdpa]
            )
        # The crossover the automatic choice measures for itself.
        causal = paths.AttentionRequest(
            q, k, v, scale=1.0 / FLEX_DIM**0.5, causal=True, score_mod=alibi
        )
        measured = relative_sdpa.measure_min_density(causal)
        rows.append(["measured", relative_sdpa.CALIBRATION_LENGTH, measured])
        for t in lengths:
            q, k, v = inputs(t)
            ids = segment_ids(t, documents, 1)
            cases = {
                "documents": dict(
                    mask_mod=mods.and_masks(
                        mods.CausalMask(),
                        mods.DocumentMask().bind(segment_ids=ids),
                    )
                ),
                "soft-cap 50": dict(
                    causal=True, score_mod=scores.SoftCap(50.0)
                ),
            }
            for case, kwargs in cases.items():
                request = paths.AttentionRequest(
                    q, k, v, scale=1.0 / FLEX_DIM**0.5, **kwargs
                )
                other = paths.automatic(request, flex_ok=False)
                fns = {
                    impl: lambda impl=impl, r=request: paths.run_path(impl, r)
                    for impl in ("flex", other)
                }
                start = time.perf_counter()
                fns["flex"]()  # Compiles.
                first = time.perf_counter() - start
                times = time_interleaved(fns, repeats=repeats, warmup=1)
                ms = times["flex"] * 1e3, times[other] * 1e3
                rows.append(
                    ["length", t, case, *ms, ms[0] / ms[1], other, first]
                )
    print(json.dumps(rows))


def memory_child(table, name, length, batch, documents):
    """One training step of one configuration (run in a fresh process)."""
    x = np.random.default_rng(0).normal(size=(batch, length, WIDTH))
    x = x.astype("float32")
    if table == "documents":
        configs = document_configs(segment_ids(length, documents, batch))
    elif table == "variants":
        configs = variant_configs()
        configs["keras + keras-hub AlibiBias"] = (
            KerasHubAlibi(HEADS, KEY_DIM),
            lambda layer, x: layer(x, x, use_causal_mask=True),
        )
    else:
        biased = keras_attention.layers.MultiHeadAttention(
            HEADS, KEY_DIM, score_mod=DistanceBias()
        )
        configs = {
            "score function, causal": (
                biased,
                lambda layer, x: layer(x, x, use_causal_mask=True),
            )
        }
    layer, call = configs[name]
    make_step(layer, call)(x)


def ratio_rows(configs, baseline, x, repeats):
    """`[name, ms, x baseline]` rows: each configuration's training step
    on `x`, traced first, then timed interleaved."""
    steps = {name: make_step(*cfg) for name, cfg in configs.items()}
    for step in steps.values():
        step(x)
    times = time_interleaved(
        {n: (lambda s=s: s(x)) for n, s in steps.items()},
        repeats=repeats,
        warmup=1,
    )
    return [[n, t * 1e3, t / times[baseline]] for n, t in times.items()]


def pair_child(other, length, documents, repeats):
    """Time ours against one alternative in this process; print JSON."""
    ids = segment_ids(length, documents, 1)
    x = np.random.default_rng(0).normal(size=(1, length, WIDTH))
    x = x.astype("float32")
    configs = document_configs(ids)
    names = ["ours (blockwise, tiles skipped)", other]
    steps = {name: make_step(*configs[name]) for name in names}
    for step in steps.values():  # Build both layers, then share weights.
        step(x)
    configs[other][0].set_weights(configs[names[0]][0].get_weights())
    outs = {name: step(x) for name, step in steps.items()}
    ref = outs[other]
    err = float(np.max(np.abs(outs[names[0]] - ref)) / np.max(np.abs(ref)))
    times = time_interleaved(
        {n: (lambda s=s: s(x)) for n, s in steps.items()},
        repeats=repeats,
        warmup=1,
    )
    print(
        json.dumps({"ours": times[names[0]], "other": times[other], "err": err})
    )


def flex_table(args):
    """Runs the flex table in a PyTorch process; its Markdown lines."""
    env = dict(os.environ, KERAS_BACKEND="torch")
    command = [sys.executable, __file__, "--flex-child"]
    command += ["--flex-lengths", *map(str, args.flex_lengths)]
    command += ["--documents", str(args.documents)]
    command += ["--repeats", str(args.repeats)]
    command += ["--flex-cases", *args.flex_cases]
    out = subprocess.run(
        command, check=True, capture_output=True, text=True, env=env
    )
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    return [
        "",
        "PyTorch, inference forward (torch.no_grad()), batch 1, "
        f"{FLEX_HEADS} heads of {FLEX_DIM}, float32, timed interleaved in "
        "one process; 'x ours': time / ours' time; 'path': what the "
        "automatic choice ran",
        "",
        markdown_table(
            [
                "T",
                "case",
                "implementation",
                "ms",
                "x ours",
                "max |diff|",
                "path",
            ],
            rows,
        ),
    ]


def thresholds_table(args):
    """Runs the thresholds table in a PyTorch process; its Markdown."""
    env = dict(os.environ, KERAS_BACKEND="torch")
    command = [sys.executable, __file__, "--thresholds-child"]
    command += ["--threshold-length", str(args.threshold_length)]
    command += ["--threshold-lengths", *map(str, args.threshold_lengths)]
    command += ["--threshold-windows", *map(str, args.threshold_windows)]
    command += ["--documents", str(args.documents)]
    command += ["--repeats", str(args.repeats)]
    out = subprocess.run(
        command, check=True, capture_output=True, text=True, env=env
    )
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    density = [r[1:] for r in rows if r[0] == "density"]
    length = [r[1:] for r in rows if r[0] == "length"]
    measured = [r[1:] for r in rows if r[0] == "measured"][0]
    return [
        "",
        "Thresholds of the automatic choice (PyTorch, inference forward, "
        f"batch 1, {FLEX_HEADS} heads of {FLEX_DIM}, float32, timed "
        "interleaved). RELATIVE_SDPA_MIN_DENSITY: ALiBi with a causal "
        "sliding window, relative_sdpa vs flex; the crossover the "
        "automatic choice measures (`relative_sdpa.measure_min_density`, "
        f"causal ALiBi at T = {measured[0]}): {measured[1]:.3g} of the "
        "pairs",
        "",
        markdown_table(
            [
                "T",
                "window",
                "pairs attended",
                "relative_sdpa ms",
                "flex ms",
                "flex / relative_sdpa",
            ],
            density,
        ),
        "",
        "FLEX_MIN_LENGTH: flex vs the path taken without it (the first "
        "flex call, compilation included, in the last column)",
        "",
        markdown_table(
            ["T", "case", "flex ms", "other ms", "flex / other", "other"]
            + ["first flex call s"],
            length,
        ),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--documents", type=int, default=8)
    parser.add_argument("--score-length", type=int, default=2048)
    parser.add_argument("--memory-length", type=int, default=32768)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--markdown")
    parser.add_argument(
        "--tables", default="documents,score,memory,variants,flex"
    )
    parser.add_argument("--variant-memory-length", type=int, default=32768)
    parser.add_argument("--keras-hub-length", type=int, default=8192)
    parser.add_argument(
        "--flex-lengths", type=int, nargs="+", default=[2048, 8192]
    )
    parser.add_argument(
        "--flex-cases",
        nargs="+",
        default=list(FLEX_CASES),
        choices=FLEX_CASES,
        help="the cases of the flex table (default: all)",
    )
    parser.add_argument(
        "--flex-child", action="store_true", help=argparse.SUPPRESS
    )
    parser.add_argument("--threshold-length", type=int, default=2048)
    parser.add_argument(
        "--threshold-lengths", type=int, nargs="+", default=[256, 512, 1024]
    )
    parser.add_argument(
        "--threshold-windows",
        type=int,
        nargs="+",
        default=[128, 256, 512, 1024, 2048],
    )
    parser.add_argument(
        "--thresholds-child", action="store_true", help=argparse.SUPPRESS
    )
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--pair", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.flex_child:
        flex_child(
            args.flex_lengths, args.documents, args.repeats, args.flex_cases
        )
        return
    if args.thresholds_child:
        thresholds_child(
            args.threshold_length,
            args.threshold_lengths,
            args.threshold_windows,
            args.documents,
            args.repeats,
        )
        return
    if args.pair:
        other, length, documents, repeats = args.pair
        pair_child(other, int(length), int(documents), int(repeats))
        return
    if args.child:
        table, name, length, batch, documents = args.child
        memory_child(table, name, int(length), int(batch), int(documents))
        return
    lines = [f"Machine: {machine_summary()}", f"Load before: {load_average()}"]
    rng = np.random.default_rng(0)

    tables = args.tables.split(",")
    if "documents" in tables:
        # 1. Packed documents: ours against each alternative in its own process
        # (two dense 8 x T^2 training steps do not fit beside each other at
        # T = 8,192), interleaved with ours there.
        rows = []
        pairs = {}
        for other in ("ours, dense path", "keras MultiHeadAttention"):
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--pair",
                    other,
                    str(args.length),
                    str(args.documents),
                    str(args.repeats),
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            pairs[other] = json.loads(out.stdout.strip().splitlines()[-1])
            lines.append(
                f"input gradient, ours vs {other}: "
                f"rel. {pairs[other]['err']:.1e}"
            )
        ours_ms = [p["ours"] * 1e3 for p in pairs.values()]
        rows.append(
            [
                "ours (blockwise, tiles skipped)",
                " / ".join(f"{t:.3g}" for t in ours_ms),
                1.0,
                None,
            ]
        )
        for other, p in pairs.items():
            rows.append([other, p["other"] * 1e3, p["other"] / p["ours"], None])
        for row in rows:
            row[3] = try_peak_rss_mb(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    "documents",
                    row[0],
                    args.length,
                    1,
                    args.documents,
                ]
            )
        lines += [
            "",
            f"Packed documents: {args.documents} in T={args.length}, batch 1,"
            " one training step (ours timed interleaved with each"
            " alternative in its own process; 'x ours' is the ratio within"
            " that process)",
            "",
            markdown_table(["layer", "ms", "x ours", "peak RSS MiB"], rows),
        ]

    if "score" in tables:
        # 2. A score function's cost.
        xs = rng.normal(size=(4, args.score_length, WIDTH)).astype("float32")
        rows = ratio_rows(
            score_configs(), "no score function", xs, args.repeats
        )
        lines += [
            "",
            f"Score function (learned distance bias), blockwise, "
            f"T={args.score_length}, batch 4",
            "",
            markdown_table(["layer", "ms", "x plain"], rows),
        ]

    if "memory" in tables:
        # 3. Memory at T=32,768 with the score function, causal.
        mem = try_peak_rss_mb(
            [
                sys.executable,
                __file__,
                "--child",
                "score",
                "score function, causal",
                args.memory_length,
                1,
                1,
            ]
        )
        lines += [
            "",
            f"Peak RSS of one causal training step with the score function, "
            f"T={args.memory_length}, batch 1: "
            + ("failed" if mem is None else f"{mem / 1024:.2f} GiB"),
        ]
    if "variants" in tables:
        xs = rng.normal(size=(4, args.score_length, WIDTH)).astype("float32")
        rows = ratio_rows(variant_configs(), "plain", xs, args.repeats)
        lines += [
            "",
            f"Variants (keras_attention.scores), blockwise, causal, "
            f"T={args.score_length}, batch 4",
            "",
            markdown_table(["score_mod", "ms", "x plain"], rows),
        ]
        rows = []
        for name, length in (
            ("ALiBi", args.variant_memory_length),
            ("plain", args.keras_hub_length),
            ("ALiBi", args.keras_hub_length),
            ("keras + keras-hub AlibiBias", args.keras_hub_length),
        ):
            child = [sys.executable, __file__, "--child", "variants", name]
            start = time.perf_counter()
            mem = try_peak_rss_mb(child + [length, 1, 1])
            rows.append([name, length, mem, time.perf_counter() - start])
        lines += [
            "",
            "Causal training step, batch 1, fresh process each (time: the"
            " whole process, start-up and tracing included)",
            "",
            markdown_table(["layer", "T", "peak RSS MiB", "process s"], rows),
        ]
    if "flex" in tables:
        lines += flex_table(args)
    if "thresholds" in tables:
        lines += thresholds_table(args)
    lines += [
        "",
        f"Load after: {load_average()}",
    ]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
