"""`--context-parallel N`: train on sequences sharded over N devices.

Each training sequence is split over the `"sequence"` axis of a
`(devices / N, N)` `("batch", "sequence")` mesh and the blocks' attention
runs as ring attention (`keras_attention.distribution.ContextParallel`):
each device holds `T / N` tokens of every sequence, their activations and
one key/value block in flight, so a device needs about the memory of a
one-device step at `T / N`. The run shows it before training, from XLA's
compiled memory analysis of the training step's forward and backward
pass (arguments, outputs and temporaries, per device; nothing runs):

    sharded, T over N devices    X MiB per device
    one device, T                Y MiB (what one device would need)
    one device, T / N            Z MiB (the same per-device length)

On the JAX backend only (the Keras distribution API and `shard_map`);
without accelerators JAX shows N virtual CPU devices, which the example
asks for (`XLA_FLAGS=--xla_force_host_platform_device_count=N`) when it
starts JAX itself. Generation, the attention explorer and the evaluation
on generation-length windows run after training, outside the scope, on
one device (cached decoding does not run as a ring).
"""

import os
import sys

# The per-device length of a run that does not set --sequence-length:
# the example's one-device default.
DEVICE_LENGTH = 128
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def check_args(parser, args):
    """Refuses at start-up what cannot run with `--context-parallel`, and
    fills in its defaults: the JAX backend when none was chosen,
    `--sequence-length` `N * 128` (`N * 64` with `--quick`) when not
    given. Call it before Keras is imported."""
    n = args.context_parallel
    if not n:
        return
    chosen = args.backend or os.environ.get("KERAS_BACKEND") or "jax"
    if n < 2:
        parser.error(
            "--context-parallel N shards each sequence over N >= 2 devices. "
            f"Received: {n!r}"
        )
    if chosen != "jax":
        parser.error(
            f"--context-parallel {n} runs ring attention with JAX's "
            "shard_map and the Keras distribution API: it needs the JAX "
            "backend (--backend jax, or no --backend and no KERAS_BACKEND). "
            f"Received: backend={chosen!r}"
        )
    args.backend = "jax"
    for name, value, allowed, why in (
        ("distribution", args.distribution, "none", "one distribution"),
        ("generate_only", args.generate_only, False, "it does not train"),
        ("dropout", args.dropout, 0.0, "ring attention forms no weights "
         "to drop out (the blocks' dropout reaches their attention)"),
    ):  # fmt: skip
        if value != allowed:
            flag = "--" + name.replace("_", "-")
            parser.error(
                f"--context-parallel cannot be combined with {flag} "
                f"({why}). Received: {flag} {value!r}"
            )
    if args.sequence_length is None:
        args.sequence_length = n * (64 if args.quick else DEVICE_LENGTH)
    if args.sequence_length % n:
        parser.error(
            f"--sequence-length must be a multiple of --context-parallel "
            f"{n} (each device holds an equal part of every sequence). "
            f"Received: {args.sequence_length!r}"
        )
    ask_for_virtual_devices(n)


def ask_for_virtual_devices(n):
    """Makes JAX show `n` CPU devices (when it has no accelerators) by
    adding XLA's flag to `XLA_FLAGS`, unless JAX is already started or
    the flag is already set."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "jax" in sys.modules or DEVICE_COUNT_FLAG in flags:
        return
    os.environ["XLA_FLAGS"] = f"{flags} {DEVICE_COUNT_FLAG}={n}".strip()


def make_context_parallel(n, batch_size):
    """The `ContextParallel` distribution of `n` sequence shards over all
    of JAX's devices: a `(devices / n, n)` ("batch", "sequence") mesh.
    `SystemExit` when the devices or the batch do not divide."""
    import keras

    from keras_attention.distribution import ContextParallel

    devices = keras.distribution.list_devices()
    if len(devices) % n:
        raise SystemExit(
            f"--context-parallel {n}: JAX shows {len(devices)} devices, not "
            f"a multiple of {n}. Without accelerators, start with "
            f"XLA_FLAGS={DEVICE_COUNT_FLAG}={n} (the example sets it when "
            "it starts JAX itself)."
        )
    replicas = len(devices) // n
    if batch_size % replicas:
        raise SystemExit(
            f"--batch-size must be a multiple of the {replicas} data-"
            f"parallel replicas ({len(devices)} devices / {n}). "
            f"Received: {batch_size!r}"
        )
    mesh = keras.distribution.DeviceMesh(
        (replicas, n), ("batch", "sequence"), devices
    )
    return ContextParallel(mesh)


def step_memory(model, batch_size, length, distribution=None):
    """Per-device bytes of the training step's forward and backward pass
    (the gradient of the cross-entropy w.r.t. every trainable weight) at
    `(batch_size, length)` token windows, from XLA's compiled memory
    analysis: `{"arguments", "outputs", "temporaries", "total"}` (total:
    their sum less what outputs alias). Compiled inside `distribution`'s
    scope with the inputs sharded as it shards them (ring attention), or
    on one device when it is None. Nothing runs. The optimizer's update
    is left out (its state is the same on every device and in both)."""
    import contextlib

    import jax
    import keras

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def loss(trainable, non_trainable, x, y):
        logits, _ = model.stateless_call(
            trainable, non_trainable, x, training=True
        )
        return loss_fn(y, logits)

    def abstract(shape, dtype, layout=None):
        sharding = None
        if layout is not None:
            spec = jax.sharding.PartitionSpec(*layout.axes)
            sharding = jax.sharding.NamedSharding(
                layout.device_mesh.backend_mesh, spec
            )
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    scope = contextlib.nullcontext()
    if distribution is not None:
        scope = distribution.scope()
    shape = (batch_size, length)
    with scope:
        layout = None
        if distribution is not None:
            layout = distribution.get_data_layout(shape)
        # The model's inputs (a dict with --pack) and the targets.
        x = keras.tree.map_structure(
            lambda _: abstract(shape, "int32", layout), model.input
        )
        y = abstract(shape, "int32", layout)
        weights = [
            [abstract(v.shape, v.dtype) for v in variables]
            for variables in (
                model.trainable_variables,
                model.non_trainable_variables,
            )
        ]
        compiled = jax.jit(jax.grad(loss)).lower(*weights, x, y).compile()
    stats = compiled.memory_analysis()
    result = {
        "arguments": stats.argument_size_in_bytes,
        "outputs": stats.output_size_in_bytes,
        "temporaries": stats.temp_size_in_bytes,
    }
    result["total"] = sum(result.values()) - stats.alias_size_in_bytes
    return result


def memory_report(model, distribution, batch_size, length):
    """The three analyses of the module docstring: `{"sharded",
    "one_device", "one_device_part"}` (each `step_memory`'s dict), and the
    lines that print them. The one-device steps take one replica's part
    of the batch (what each device of a data-parallel run holds)."""
    mesh = distribution.device_mesh
    n = mesh.shape[list(mesh.axis_names).index(distribution.sequence_axis)]
    batch = batch_size // distribution.num_model_replicas
    rows = (
        ("sharded", f"sharded, T={length} over {n} devices", length),
        ("one_device", f"one device, T={length}", length),
        ("one_device_part", f"one device, T={length // n}", length // n),
    )
    report, lines = {}, []
    for key, label, size in rows:
        if key == "sharded":
            report[key] = step_memory(model, batch_size, size, distribution)
        else:
            report[key] = step_memory(model, batch, size)
        mib = report[key]["total"] / 2**20
        lines.append(f"  {label:<32} {mib:9.1f} MiB per device")
    ratio = report["one_device"]["total"] / report["sharded"]["total"]
    lines.append(
        f"  one device would need {ratio:.1f}x the memory of each of the "
        f"{n} devices for T={length}"
    )
    header = (
        "training step memory per device (forward and backward pass, "
        f"{batch} sequences per replica; XLA's compiled memory analysis):"
    )
    return report, [header] + lines
