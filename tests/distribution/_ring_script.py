"""Ring attention on 8 virtual CPU devices against one-device attention.

Run by `test_ring_attention.py` in its own process, with
`XLA_FLAGS=--xla_force_host_platform_device_count=8 KERAS_BACKEND=jax`
(and the suite's XLA flags) set before JAX starts. Each case computes
`ka.distribution.ring_attention` and `ka.ops.dot_product_attention` (one
device, the same masks and scores on the whole sequence) and the
gradients of `sum(output * w)` w.r.t. query, key, value (and a score
layer's weights), each pair in one `jax.jit`; prints one line per case
(`CASE group name: ok | FAIL ...`) and a final `RESULT {json}`:
`{group: {name: {"out": err, "grad": err} | {"error": text}}}`. Then a
decoder's `fit` under `ContextParallel` against one device (`_FitCase`)
and the per-device memory of its training step (`_MemoryCase`).

Non-causal attention without mask or score runs in no case of its own:
its blocks are those of the non-causal mask and score cases (both
layouts), and with neither the layout changes nothing but the order,
which every case restores.
"""

import json
import os
import sys
import tempfile
import time
import traceback

# A JAX program: TensorFlow (installed for the TensorFlow backend) is kept
# out; `keras.utils.set_random_seed` would import it to seed it (~2 s CPU).
# So is scikit-learn, which Keras imports for its wrappers (~2 s).
sys.modules["tensorflow"] = None
sys.modules["sklearn"] = None

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_attention as ka  # noqa: E402
from keras_attention import mods  # noqa: E402
from keras_attention import scores  # noqa: E402
from keras_attention.blocks import TransformerDecoderBlock  # noqa: E402

B, T, H, D = 2, 64, 2, 8
RNG = np.random.default_rng(0)


def _normal(*shape):
    return RNG.normal(size=shape).astype("float32")


def _documents(length):
    """Segment ids of packed documents of 13, 20, 9, ... tokens: every
    boundary falls inside some device's block, and documents span
    several devices in both layouts; the two examples differ."""
    first = np.repeat(np.arange(8), [13, 20, 9, 5, 7, 4, 3, 3])[:length]
    second = np.repeat(np.arange(4), [30, 2, 17, 15])[:length]
    return np.stack([first, second]).astype("int32")


def _sequence_mesh():
    devices = keras.distribution.list_devices()
    return keras.distribution.DeviceMesh((8,), ["sequence"], devices)


def _data_sequence_mesh():
    devices = np.array(jax.devices()).reshape(2, 4)
    return jax.sharding.Mesh(devices, ("data", "sequence"))


class _Case:
    def __init__(self, group, name, length=T, kv_heads=H, mesh=None, **kw):
        self.group, self.name = group, name
        self.length, self.kv_heads = length, kv_heads
        self.mesh = mesh or _sequence_mesh
        self.causal = kw.pop("causal", False)
        self.layout = kw.pop("layout", "striped")
        self.mask_mod = kw.pop("mask_mod", None)
        self.score_mod = kw.pop("score_mod", None)
        self.segment_ids = kw.pop("segment_ids", None)
        self.scope = kw.pop("scope", None)
        self.padding = kw.pop("padding", None)
        if kw:
            raise TypeError(f"unknown case options {sorted(kw)}")

    def reference_mask(self):
        """The one-device mask: the case's mask and its documents."""
        if self.segment_ids is None:
            return self.mask_mod
        documents = mods.DocumentMask().bind(segment_ids=self.segment_ids)
        if self.mask_mod is None:
            return documents
        return mods.and_masks(self.mask_mod, documents)

    def run(self):
        q = _normal(B, self.length, H, D)
        k = _normal(B, self.length, self.kv_heads, D)
        v = _normal(B, self.length, self.kv_heads, D)
        w = _normal(B, self.length, H, D)
        mesh = self.mesh()
        variables = list(getattr(self.score_mod, "variables", ()) or ())
        if isinstance(self.score_mod, keras.layers.Layer):
            self.score_mod.build(H)
            variables = list(self.score_mod.trainable_variables)
        values = [keras.ops.convert_to_numpy(x) for x in variables]

        padding = {}
        if self.padding is not None:
            padding = {"query_mask": self.padding, "key_mask": self.padding}

        def ring(q, k, v):
            return ka.distribution.ring_attention(
                q,
                k,
                v,
                mesh,
                causal=self.causal,
                mask_mod=self.mask_mod,
                score_mod=self.score_mod,
                segment_ids=self.segment_ids,
                layout=self.layout,
                **padding,
            )

        def one_device(q, k, v):
            return ka.ops.dot_product_attention(
                q,
                k,
                v,
                causal=self.causal,
                mask_mod=self.reference_mask(),
                score_mod=self.score_mod,
                **padding,
            )

        def grads(fn):
            def loss(q, k, v, values):
                mapping = list(zip(variables, values))
                with keras.StatelessScope(state_mapping=mapping):
                    out = fn(q, k, v)
                return keras.ops.sum(out * w), out

            grad = jax.value_and_grad(loss, (0, 1, 2, 3), has_aux=True)
            (_, out), g = jax.jit(grad)(q, k, v, values)
            return np.asarray(out), [np.asarray(x) for x in jax.tree.leaves(g)]

        if self.scope is not None:
            with ka.ops.implementation_scope(*self.scope[:1], **self.scope[1]):
                out, g = grads(ring)
        else:
            out, g = grads(ring)
        ref, g_ref = grads(one_device)
        return {
            "out": float(np.abs(out - ref).max()),
            "grad": max(float(np.abs(a - b).max()) for a, b in zip(g, g_ref)),
        }


class _FitCase:
    """`model.fit` of a small decoder (padding mask, grouped-query
    attention, rotary positions) under `ContextParallel` on a 2 x 4
    (batch x sequence) mesh, against the same training on one device:
    losses, weights, logits; the model saved from the sharded run and
    reloaded outside the scope (one device) predicts the same."""

    group, name = "keras", "fit on 2x4, .keras reloaded on one device"
    vocab, width, batch, steps = 32, 16, 4, 2

    def build(self):
        ids = keras.Input((T,), dtype="int32")
        x = keras.layers.Embedding(self.vocab, self.width, mask_zero=True)(ids)
        x = TransformerDecoderBlock(
            2,
            2 * self.width,
            cross_attention=False,
            norm_first=True,
            num_key_value_heads=1,
            rotary_max_wavelength=100,
            name="block",
        )(x)
        logits = keras.layers.Dense(self.vocab, name="logits")(x)
        return keras.Model(ids, logits)

    def train(self, initial, x, y):
        model = self.build()
        model.set_weights(initial)
        model.compile(
            keras.optimizers.SGD(0.5),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        history = model.fit(
            x, y, batch_size=self.batch, shuffle=False, verbose=0
        )
        weights = [np.asarray(w) for w in model.get_weights()]
        return model, history.history["loss"], weights

    def predict(self, model, x):
        return np.asarray(model.predict(x, batch_size=self.batch, verbose=0))

    def run(self):
        rows = self.batch * self.steps
        ids = RNG.integers(1, self.vocab, size=(rows, T + 1))
        lengths = T + 1 - 7 * np.arange(rows)  # padded ends (mask_zero)
        ids = np.where(np.arange(T + 1) < lengths[:, None], ids, 0)
        x, y = ids[:, :-1].astype("int32"), ids[:, 1:].astype("int32")
        keras.utils.set_random_seed(1)
        initial = self.build().get_weights()
        model, losses, weights = self.train(initial, x, y)
        logits = self.predict(model, x)
        mesh = keras.distribution.DeviceMesh(
            (2, 4), ("batch", "sequence"), keras.distribution.list_devices()
        )
        distribution = ka.distribution.ContextParallel(mesh)
        with distribution.scope():
            model, ring_losses, ring_weights = self.train(initial, x, y)
            jaxpr = str(jax.make_jaxpr(model)(x[: self.batch]))
        if "ppermute" not in jaxpr:
            raise AssertionError("the model did not run ring attention")
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "model.keras")
            model.save(path)
            reloaded = keras.saving.load_model(path)
        # The sharded model's forward pass is its training losses'; its
        # weights, saved and reloaded on one device, predict the logits
        # of the one-device training.
        return {
            "loss": max(abs(a - b) for a, b in zip(losses, ring_losses)),
            "weights": max(
                float(np.abs(a - b).max())
                for a, b in zip(weights, ring_weights)
            ),
            "reloaded logits": float(
                np.abs(self.predict(reloaded, x) - logits).max()
            ),
        }


class _MemoryCase:
    """Per-device memory of a decoder's training step (the gradient of
    its loss w.r.t. every weight; XLA's compiled memory analysis:
    arguments, outputs and temporaries, nothing run) under
    `ContextParallel` on 8 devices against the same step on one device,
    at T = 1,024: activations and attention are sharded, the replicated
    weights are few, so the ratio is near 1/8 (`passes`: at most 1/4)."""

    group, name = "memory", "training step per device, 8 devices / one"
    length, vocab, width, batch = 1024, 32, 16, 2

    def step_memory(self, model, distribution=None):
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        def loss(weights, x, y):
            logits, _ = model.stateless_call(weights, [], x, training=True)
            return loss_fn(y, logits)

        shape, sharding = (self.batch, self.length), None
        if distribution is not None:
            spec = jax.sharding.PartitionSpec("batch", "sequence")
            mesh = distribution.device_mesh.backend_mesh
            sharding = jax.sharding.NamedSharding(mesh, spec)
        tokens = jax.ShapeDtypeStruct(shape, "int32", sharding=sharding)
        weights = [
            jax.ShapeDtypeStruct(v.shape, v.dtype)
            for v in model.trainable_variables
        ]
        lowered = jax.jit(jax.grad(loss)).lower(weights, tokens, tokens)
        stats = lowered.compile().memory_analysis()
        total = (
            stats.argument_size_in_bytes
            + stats.output_size_in_bytes
            + stats.temp_size_in_bytes
            - stats.alias_size_in_bytes
        )
        return total / 2**20

    def run(self):
        mesh = keras.distribution.DeviceMesh(
            (1, 8), ("batch", "sequence"), keras.distribution.list_devices()
        )
        distribution = ka.distribution.ContextParallel(mesh)
        with distribution.scope():
            ids = keras.Input((self.length,), dtype="int32")
            x = keras.layers.Embedding(self.vocab, self.width)(ids)
            x = TransformerDecoderBlock(
                2, 2 * self.width, cross_attention=False, norm_first=True
            )(x)
            model = keras.Model(ids, keras.layers.Dense(self.vocab)(x))
            sharded = self.step_memory(model, distribution)
        one = self.step_memory(model)
        return {"sharded MiB": sharded, "one device MiB": one}

    @staticmethod
    def passes(result):
        return result["sharded MiB"] <= result["one device MiB"] / 4


def _cases():
    docs = _documents(T)
    prefix = mods.PrefixLMMask().bind(prefix_length=np.array([5, 40]))
    per_example = mods.DocumentMask().bind(segment_ids=docs)
    tiles = ("blockwise", {"query_block": 4, "key_block": 4})
    window = mods.or_masks(
        mods.KerasSlidingWindowMask(3), mods.ChunkedCausalMask(12)
    )
    return [
        _Case("layouts", "striped causal", causal=True),
        _Case("layouts", "contiguous causal", causal=True, layout="contiguous"),
        _Case(
            "layouts",
            "striped causal blockwise tiles, grouped-query",
            causal=True,
            kv_heads=1,
            scope=tiles,
        ),
        _Case(
            "masks",
            "CausalMask",
            mask_mod=mods.CausalMask(),
            layout="contiguous",
        ),
        _Case(
            "masks",
            "SlidingWindowMask",
            mask_mod=mods.SlidingWindowMask((5, 2)),
        ),
        _Case(
            "masks",
            "KerasSlidingWindowMask | ChunkedCausalMask",
            mask_mod=window,
            layout="contiguous",
        ),
        _Case("masks", "PrefixLMMask", mask_mod=mods.PrefixLMMask(10)),
        _Case(
            "masks",
            "DocumentMask bound, causal",
            causal=True,
            mask_mod=per_example,
        ),
        _Case("masks", "segment_ids, causal", causal=True, segment_ids=docs),
        _Case(
            "masks",
            "segment_ids, contiguous, blockwise tiles",
            segment_ids=docs,
            layout="contiguous",
            scope=tiles,
        ),
        _Case(
            "masks",
            "query_mask and key_mask (padding), contiguous causal",
            causal=True,
            layout="contiguous",
            padding=np.arange(T)[None, :] < np.array([[T], [37]]),
        ),
        _Case("scores", "ALiBi causal", causal=True, score_mod=scores.ALiBi()),
        _Case(
            "scores",
            "ALiBi bidirectional",
            score_mod=scores.ALiBi(bidirectional=True),
            layout="contiguous",
        ),
        _Case(
            "scores",
            "T5RelativeBias (weights' gradient)",
            causal=True,
            score_mod=scores.T5RelativeBias(num_buckets=8, max_distance=20),
        ),
        _Case(
            "scores",
            "SoftCap",
            causal=True,
            layout="contiguous",
            score_mod=scores.SoftCap(2.0),
        ),
        _Case("padding", "T=60 striped causal", length=60, causal=True),
        _Case("padding", "T=60 contiguous", length=60, layout="contiguous"),
        _Case(
            "mesh 2x4",
            "striped, per-example prefix-LM, T5, segment_ids",
            mesh=_data_sequence_mesh,
            mask_mod=prefix,
            score_mod=scores.T5RelativeBias(num_buckets=8, max_distance=20),
            segment_ids=docs,
        ),
        _Case(
            "mesh 2x4",
            "contiguous, DocumentMask bound",
            mesh=_data_sequence_mesh,
            layout="contiguous",
            mask_mod=per_example,
        ),
        _FitCase(),
        _MemoryCase(),
    ]


def _within_tolerance(result):
    return max(result.values()) <= 1e-5


def main():
    start = time.time()
    results = {}
    for case in _cases():
        began = time.time()
        try:
            result = case.run()
            passes = getattr(case, "passes", _within_tolerance)
            status = "ok" if passes(result) else "FAIL"
        except Exception:  # noqa: BLE001 - reported per case
            result = {"error": traceback.format_exc(limit=-6)}
            status = "FAIL (error)"
        results.setdefault(case.group, {})[case.name] = result
        took = time.time() - began
        print(f"CASE {case.group} / {case.name}: {status} {result} {took:.1f}s")
        sys.stdout.flush()
    results["seconds"] = time.time() - start
    results["devices"] = len(jax.devices())
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
