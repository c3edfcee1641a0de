"""`get_layout_map`: the `LayoutMap` that shards the library's layers."""

import keras

from keras_attention.utils import validation

# Each entry: (regex over `variable.path`, layout as mesh-axis roles).
# "model" is replaced by the model-parallel axis name, None replicates.
# Layouts are *leading* axes only: a `PartitionSpec` shorter than the
# variable's rank replicates the remaining axes, so one entry fits the
# rank-3 kernels of the attention layers and the rank-2 kernels of the
# additive (Bahdanau/Luong) layers, which use the same sublayer names.
# Every pattern starts with `.*/`: `LayoutMap` uses `re.fullmatch`, and a
# pattern without it matches no weight at all.

# Queries (and the gate of `use_gate=True`, and the global queries of
# `LocalSelfAttention(global_projections=True)`): kernel (d, h, k), bias
# (h, k); `BahdanauAttention`'s query kernel (d, u): sharded over units u.
_QUERY = (
    (r".*/(query|query_global|gate)/kernel", (None, "model")),
    (r".*/(query|query_global|gate)/bias", ("model",)),
)
# Keys and values (and the global ones of `LocalSelfAttention(
# global_projections=True)`): kernel (d, h_kv, k), bias (h_kv, k);
# `BahdanauAttention` key kernel (d, u) and `LuongAttention(score_mode=
# "general")` key kernel (d_v, d_q): sharded over their last axis.
_KEY_VALUE = (
    (r".*/(key|value|key_global|value_global)/kernel", (None, "model")),
    (r".*/(key|value|key_global|value_global)/bias", ("model",)),
)
_REST = (
    # Output projection (h, k, d): row-parallel over the heads.
    (r".*/attention_output/kernel", ("model",)),
    # `FeedForward`: column-parallel (d, f) (and its gate's, `gated=True`),
    # then row-parallel (f, d).
    (r".*/(intermediate_dense|gate_dense)/kernel", (None, "model")),
    (r".*/(intermediate_dense|gate_dense)/bias", ("model",)),
    (r".*/output_dense/kernel", ("model",)),
    # `BahdanauAttention` v and bias (u,), `LuongAttention(score_mode=
    # "concat")` v (u,) and kernel (d_q + d_v, u): sharded over units.
    (r".*/attention_(v|bias)", ("model",)),
    (r".*/concat_kernel", (None, "model")),
)


def get_layout_map(
    device_mesh,
    model_parallel_dim_name="model",
    data_parallel_dim_name="batch",
    *,
    shard_key_value=True,
):
    """A `keras.distribution.LayoutMap` that shards the library's layers.

    Tensor (model) parallelism in the Megatron-LM way, on the
    `model_parallel_dim_name` axis of `device_mesh` (JAX backend):

    | weights | shape | sharded over |
    | --- | --- | --- |
    | `query`, `key`, `value`, `gate` kernels | `(d, heads, head_dim)` | heads |
    | `query_global`, `key_global`, `value_global` kernels | same | heads |
    | their biases | `(heads, head_dim)` | heads |
    | `attention_output` kernel | `(heads, head_dim, d)` | heads |
    | `FeedForward` `intermediate_dense` kernel, bias | `(d, f)`, `(f,)` | f |
    | gated `FeedForward` `gate_dense` kernel, bias | `(d, f)`, `(f,)` | f |
    | `FeedForward` `output_dense` kernel | `(f, d)` | f |
    | `BahdanauAttention` `query`, `key` kernels | `(d, u)` | units u |
    | `BahdanauAttention` `attention_v`, `attention_bias` | `(u,)` | u |
    | `LuongAttention` `key` kernel (`"general"`) | `(d_v, d_q)` | d_q |
    | `LuongAttention` `concat_kernel` (`"concat"`) | `(d_q + d_v, u)` | u |
    | `LuongAttention` `attention_v` (`"concat"`) | `(u,)` | u |

    This covers `MultiHeadAttention`, `SelfAttention`, `CausalSelfAttention`,
    `CrossAttention`, `LocalSelfAttention` (with Longformer's global
    projections, `global_projections=True`), `FeedForward`, the
    `TransformerEncoderBlock`/`TransformerDecoderBlock` (their
    `self_attention`, `cross_attention` and `feed_forward` sublayers),
    `BahdanauAttention` and `LuongAttention`, whatever their names and
    nesting: the patterns match the sublayer names (`.../query/kernel`,
    `.../feed_forward/intermediate_dense/kernel`, ...). Each block's
    attention then needs one all-reduce after `attention_output` and one
    after `output_dense`, inserted by XLA. Everything else (norms, output
    biases, embeddings, scalars) is replicated: add entries to the returned
    map for your own weights (e.g. `layout_map[".*/embeddings"] =
    (None, "model")`), with a leading `.*/` (`LayoutMap` matches the whole
    path: a pattern without it matches nothing and leaves the weight
    replicated).

    Weights are replicated along `data_parallel_dim_name` (pass the same
    name as `ModelParallel(batch_dim_name=...)`, which splits the batch
    over it).

    Every sharded axis must be divisible by the size of the model axis:
    `num_heads`, the feed-forward `intermediate_dim`, the additive layers'
    `units`. Otherwise JAX refuses the weight when it is created ("... should
    be divisible by ...").

    Grouped-query attention (`num_key_value_heads`): key and value are
    sharded over their `num_key_value_heads` heads, each device then holds
    the key/value heads of its query heads, and the result is exact. When
    `num_key_value_heads` is not a multiple of the model axis size (e.g.
    one or two key/value heads on a model axis of 4), pass
    `shard_key_value=False`: key and value projections (kernels and
    biases, the global ones of `LocalSelfAttention` too) are then
    replicated on every device, as Megatron-LM and vLLM do when the
    tensor-parallel size exceeds the number of key/value heads; queries and
    output stay sharded by heads.

    Args:
        device_mesh: `keras.distribution.DeviceMesh`, with axes named
            `model_parallel_dim_name` and `data_parallel_dim_name`.
        model_parallel_dim_name: str, the mesh axis the weights are
            sharded over.
        data_parallel_dim_name: str, the mesh axis the batch is split over
            (weights are replicated along it).
        shard_key_value: bool, whether key and value projections are
            sharded by heads (default) or replicated (for grouped-query
            attention with fewer key/value heads than the model axis).

    Returns:
        A `keras.distribution.LayoutMap` for
        `keras.distribution.ModelParallel(layout_map=..., batch_dim_name=
        data_parallel_dim_name)`.

    Example:

    >>> import keras
    >>> import keras_attention.distribution
    >>> mesh = keras.distribution.DeviceMesh(
    ...     shape=(1, 1), axis_names=("batch", "model"), devices=["cpu:0"]
    ... )
    >>> layout_map = keras_attention.distribution.get_layout_map(mesh)
    >>> layout_map["lm/decoder_block_0/self_attention/query/kernel"].axes
    (None, 'model')
    >>> layout_map["lm/decoder_block_0/feed_forward/output_dense/kernel"].axes
    ('model',)
    >>> print(layout_map["lm/decoder_block_0/self_attention_norm/gamma"])
    None

    On 8 accelerators (2-way data, 4-way model parallelism; JAX backend):

    ```python
    mesh = keras.distribution.DeviceMesh(
        (2, 4), ("batch", "model"), keras.distribution.list_devices()
    )
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(
            layout_map=keras_attention.distribution.get_layout_map(mesh),
            batch_dim_name="batch",
        )
    )
    model = build_model()  # weights are created sharded
    ```

    References:
        - Shoeybi et al., 2019, "Megatron-LM: Training Multi-Billion
          Parameter Language Models Using Model Parallelism".
    """
    if not isinstance(device_mesh, keras.distribution.DeviceMesh):
        raise ValueError(
            "`device_mesh` must be a `keras.distribution.DeviceMesh`. "
            f"Received: device_mesh={device_mesh!r}"
        )
    axis_names = tuple(device_mesh.axis_names)
    for name, value in (
        ("model_parallel_dim_name", model_parallel_dim_name),
        ("data_parallel_dim_name", data_parallel_dim_name),
    ):
        if not isinstance(value, str) or value not in axis_names:
            raise ValueError(
                f"`{name}` must be one of the mesh's axis names "
                f"{axis_names}. Received: {name}={value!r}"
            )
    if model_parallel_dim_name == data_parallel_dim_name:
        raise ValueError(
            "`model_parallel_dim_name` and `data_parallel_dim_name` must "
            "name different mesh axes. Received: model_parallel_dim_name="
            f"{model_parallel_dim_name!r}, data_parallel_dim_name="
            f"{data_parallel_dim_name!r}"
        )
    shard_key_value = validation.check_bool("shard_key_value", shard_key_value)
    entries = _QUERY + (_KEY_VALUE if shard_key_value else ()) + _REST
    layout_map = keras.distribution.LayoutMap(device_mesh)
    for pattern, roles in entries:
        layout_map[pattern] = tuple(
            model_parallel_dim_name if r == "model" else r for r in roles
        )
    return layout_map
