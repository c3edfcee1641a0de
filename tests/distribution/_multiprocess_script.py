"""One process of a two-process JAX run (Keras's multi-host path).

    python tests/distribution/_multiprocess_script.py PORT PROCESS_ID OUT

Process `PROCESS_ID` (0 or 1) of 2 joins the coordinator at
127.0.0.1:PORT through `keras.distribution.initialize`, trains a tiny
decoder-only language model from the library's blocks with `DataParallel`
over the 2 processes' devices (each process feeds its half of every global
batch), and writes its losses and final weights to OUT (`.npz`). With
PROCESS_ID -1 it runs alone on one device with the whole global batch (the
reference); process 0 of the pair also writes that reference, after its
distributed run, to `OUT` with `-ref` before `.npz` (one process less to
start). KERAS_BACKEND=jax must be set by the caller.
"""

import sys

# A JAX program: TensorFlow (installed for the TensorFlow backend) is kept
# out; `keras.utils.set_random_seed` would import it to seed it (~2 s CPU
# per process).
sys.modules["tensorflow"] = None

import jax  # noqa: E402

PORT, PROCESS_ID, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
NUM_PROCESSES, VOCAB, HIDDEN, STEPS, GLOBAL_BATCH = 2, 32, 16, 3, 8

if PROCESS_ID >= 0:
    # CPU collectives between processes go through gloo (TCP).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_attention.blocks import TransformerDecoderBlock  # noqa: E402


def build():
    keras.utils.set_random_seed(0)
    ids = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, HIDDEN, name="embedding")(ids)
    x = TransformerDecoderBlock(
        2,
        2 * HIDDEN,
        cross_attention=False,
        norm_first=True,
        rotary_max_wavelength=100,
        name="decoder_block_0",
    )(x)
    x = keras.layers.Dense(VOCAB, name="logits")(x)
    model = keras.Model(ids, x)
    model.compile(
        keras.optimizers.SGD(0.5),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def train(inputs, targets, batch, out):
    model = build()
    history = model.fit(
        inputs, targets, batch_size=batch, shuffle=False, verbose=0
    )
    weights = [np.asarray(w) for w in model.get_weights()]
    np.savez(
        out,
        losses=np.asarray(history.history["loss"]),
        devices=np.asarray(len(jax.devices())),
        **{f"w{i}": w for i, w in enumerate(weights)},
    )


def main():
    rng = np.random.default_rng(0)
    ids = rng.integers(1, VOCAB, size=(GLOBAL_BATCH * STEPS, 9))
    ids = ids.astype("int32")
    inputs, targets = ids[:, :-1], ids[:, 1:]
    if PROCESS_ID >= 0:
        keras.distribution.initialize(
            job_addresses=f"127.0.0.1:{PORT}",
            num_processes=NUM_PROCESSES,
            process_id=PROCESS_ID,
        )
        keras.distribution.set_distribution(
            keras.distribution.DataParallel(
                devices=keras.distribution.list_devices(),
                # Each process passes its own rows (NumPy, already split).
                auto_shard_dataset=False,
            )
        )
        # This process's rows of every global batch: the global batch is
        # the processes' local batches in process order.
        batch = GLOBAL_BATCH // NUM_PROCESSES
        rows = np.arange(len(ids)).reshape(STEPS, NUM_PROCESSES, batch)
        rows = rows[:, PROCESS_ID].reshape(-1)
        train(inputs[rows], targets[rows], batch, OUT)
    if PROCESS_ID <= 0:
        # The reference: this process's own device, no distribution, the
        # whole global batch.
        keras.distribution.set_distribution(None)
        out = OUT if PROCESS_ID < 0 else OUT[: -len(".npz")] + "-ref.npz"
        train(inputs, targets, GLOBAL_BATCH, out)
    print(f"process {PROCESS_ID}: {len(jax.devices())} devices, done")


if __name__ == "__main__":
    main()
