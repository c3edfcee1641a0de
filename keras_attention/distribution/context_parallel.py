"""`ContextParallel`: a Keras distribution that shards the sequence and
runs the library's attention as ring attention."""

import contextlib

import keras

from keras_attention.distribution import _ring_path
from keras_attention.distribution.ring_attention import LAYOUTS
from keras_attention.ops import paths

# Keras exports its distributions (`DataParallel`, `ModelParallel`) but
# not their base class, `keras.src.distribution.Distribution`.
_Distribution = keras.distribution.DataParallel.__bases__[0]


class ContextParallel(_Distribution):
    """Context parallelism for `model.fit`: inputs sharded over the batch
    and the sequence, weights replicated, attention as a ring.

    A `keras.distribution.Distribution` (JAX backend) over a mesh with a
    sequence axis and, optionally, a batch axis (data parallelism beside
    it). Inside `scope()`:

    - input arrays `(b, T, ...)` are sharded over `(batch_axis,
      sequence_axis)` (the sequence axis only when it divides `T`; rank-1
      inputs over the batch only);
    - weights are replicated (every device holds the whole model);
    - every `keras_attention.ops.dot_product_attention` call, so the
      attention of `MultiHeadAttention`, `SelfAttention`,
      `CausalSelfAttention`, `CrossAttention` over the same sequence and
      the blocks, `MultiHeadLatentAttention` (and the blocks'
      `latent_attention`), runs as `ring_attention` (the "ring" path of
      `implementation_scope`). `AttentionPooling` sums over the
      sequence: XLA reduces over the shards. The other layers that are
      not attention are elementwise along the sequence: XLA runs them
      on the shards.

    Use `scope()` around building and training (Keras's own
    `set_distribution` alone does not enter the ring's scope, and the
    data layout refuses it):

        distribution = ContextParallel(mesh, "sequence", "batch")
        with distribution.scope():
            model = build_model()
            model.fit(tokens, labels)

    What cannot run as a ring is refused inside the scope (`ValueError`
    naming the layer or the option; any other kernel would gather the
    sequence): the attention layers with their own kernels
    (`LinearAttention`, `GatedDeltaNet`, `GraphAttention`,
    `BahdanauAttention`, `LuongAttention`, `AttentionRNNDecoder`, and a
    user's `AttentionRecording` layer unless it sets
    `runs_context_parallel = True`) and the ops `linear_attention`,
    `gated_delta_rule`, `local_attention`, `global_local_attention`;
    returned attention scores, dropout on the weights in training, a
    layer's `flash_attention` set, another `implementation=` or a nested
    `implementation_scope` of another path, `LocalSelfAttention`'s
    global tokens and `block_size`, dense attention masks, learned sinks
    (a layer's `learned_sinks=True`, the op's `sink_logits`), a
    log-sum-exp output (`return_lse=True`) and cache offsets (generate
    outside the scope, on one device); each error names the argument
    and its value.
    Sliding windows (`sliding_window`, `LocalSelfAttention`, the blocks'
    `window_size`) run on the ring as mask functions on global
    positions. Keras's own `keras.layers.MultiHeadAttention` (and any
    layer outside this library) is not seen by the scope: its attention
    would run on the gathered sequence; use the library's.

    Other backends: `NotImplementedError` naming the backend.

    Args:
        device_mesh: a `keras.distribution.DeviceMesh` whose axes are
            `sequence_axis` and, optionally, `batch_axis`.
        sequence_axis: the mesh axis the sequence is split over.
        batch_axis: the mesh axis the batch is split over, or None.
        layout: "striped" or "contiguous" (`ring_attention`).
        auto_shard_dataset: Keras's (several processes).

    Example:

    >>> import keras
    >>> import keras_attention as ka
    >>> if keras.backend.backend() == "jax":
    ...     devices = keras.distribution.list_devices()[:1]
    ...     mesh = keras.distribution.DeviceMesh((1,), ["sequence"], devices)
    ...     distribution = ka.distribution.ContextParallel(
    ...         mesh, batch_axis=None)
    ...     with distribution.scope():
    ...         axes = distribution.get_data_layout((4, 16)).axes
    ... else:  # The Keras distribution API runs on JAX.
    ...     axes = (None, "sequence")
    >>> axes
    (None, 'sequence')
    """

    def __init__(
        self,
        device_mesh,
        sequence_axis="sequence",
        batch_axis="batch",
        layout="striped",
        auto_shard_dataset=True,
    ):
        backend = keras.backend.backend()
        if backend != "jax":
            raise NotImplementedError(
                "`ContextParallel` runs on the JAX backend only (its ring "
                "attention shards the sequence with JAX's `shard_map` and "
                "`ppermute`; `keras.distribution` is JAX-only too). The "
                f"current backend is {backend!r}: set KERAS_BACKEND=jax."
            )
        if not isinstance(device_mesh, keras.distribution.DeviceMesh):
            raise ValueError(
                "`device_mesh` must be a `keras.distribution.DeviceMesh`. "
                f"Received: device_mesh={device_mesh!r}"
            )
        names = tuple(device_mesh.axis_names)
        if sequence_axis not in names:
            raise ValueError(
                f"`sequence_axis` must name an axis of the mesh {names!r}. "
                f"Received: sequence_axis={sequence_axis!r}"
            )
        expected = {sequence_axis} | ({batch_axis} - {None})
        if batch_axis == sequence_axis or set(names) != expected:
            raise ValueError(
                "The mesh's axes must be `sequence_axis` and `batch_axis` "
                "(the batch is sharded over every axis but the sequence's). "
                f"Received: mesh axes {names!r}, "
                f"sequence_axis={sequence_axis!r}, batch_axis={batch_axis!r}"
            )
        if layout not in LAYOUTS:
            raise ValueError(
                f"`layout` must be one of {LAYOUTS}. "
                f"Received: layout={layout!r}"
            )
        super().__init__(device_mesh, batch_axis, auto_shard_dataset)
        self.sequence_axis, self.layout = sequence_axis, layout

    @property
    def num_model_replicas(self):
        if self.batch_dim_name is None:
            return 1
        names = list(self.device_mesh.axis_names)
        return self.device_mesh.shape[names.index(self.batch_dim_name)]

    def _axis_size(self, name):
        names = list(self.device_mesh.axis_names)
        return self.device_mesh.shape[names.index(name)]

    def get_data_layout(self, data_shape):
        if paths.current_scope().name != _ring_path.RING.name:
            raise ValueError(
                "ContextParallel shards the inputs' sequence and runs "
                "attention as a ring only inside its scope: `with "
                "distribution.scope(): model.fit(...)` (not "
                "`keras.distribution.set_distribution` alone). Received: "
                f"data_shape={tuple(data_shape)!r} outside the scope"
            )
        axes = [None] * len(data_shape)
        if axes:
            axes[0] = self.batch_dim_name
        length = data_shape[1] if len(data_shape) > 1 else None
        if length and length % self._axis_size(self.sequence_axis) == 0:
            axes[1] = self.sequence_axis
        return keras.distribution.TensorLayout(axes, self.device_mesh)

    def get_variable_layout(self, variable):
        layout = getattr(variable, "_layout", None)
        if layout is not None:
            return layout
        axes = [None] * len(variable.shape)
        return keras.distribution.TensorLayout(axes, self.device_mesh)

    def get_tensor_layout(self, path):
        return None

    @contextlib.contextmanager
    def scope(self):
        """Makes this the Keras distribution and runs the library's
        attention as ring attention on its mesh."""
        with super().scope():
            with paths.implementation_scope(
                _ring_path.RING.name,
                mesh=self.device_mesh,
                sequence_axis=self.sequence_axis,
                layout=self.layout,
            ):
                yield
