import inspect

import keras
from keras import ops

from keras_attention.layers import recording
from keras_attention.layers.multi_head_attention import MultiHeadAttention
from keras_attention.layers.seq2seq_attention import Seq2SeqAttention
from keras_attention.ops import scan_carry
from keras_attention.utils import keras_utils
from keras_attention.utils import validation

STYLES = ("bahdanau", "luong")
_TARGET_LAYOUT = "(batch, Tt, features)"
_MEMORY_LAYOUT = "(batch, Ts, features)"
CELLS = {"gru": keras.layers.GRUCell, "lstm": keras.layers.LSTMCell}


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _cross_mask_argument(attention):
    """The memory-mask argument of a multi-head attention layer called as
    `attention(query, memory, ..., cache=...)`, or None if it cannot be.

    `MultiHeadAttention` takes `value_mask`, `CrossAttention` takes
    `context_mask`; self-attention layers (`SelfAttention` and its
    subclasses) take one sequence and cannot attend to a memory.
    """
    if not isinstance(attention, MultiHeadAttention):
        return None
    params = inspect.signature(attention.call).parameters
    names = [
        n
        for n, p in params.items()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(names) < 2 or names[0] != "query":
        return None
    if "cache" not in params or "return_attention_scores" not in params:
        return None
    axes = getattr(attention, "attention_axes", None)
    if axes is not None and tuple(_as_list(axes)) not in ((1,), (-2,)):
        return None  # attention over other axes than time
    for name in ("context_mask", "value_mask"):
        if name in params:
            return name
    return None


def _cell_sizes(cell):
    """`(output_size, first state size)` of an RNN cell (ints or None)."""
    states = _as_list(cell.state_size)
    output = getattr(cell, "output_size", None)
    if output is None:
        output = getattr(cell, "units", None)
    as_int = lambda n: int(n) if isinstance(n, int) else None  # noqa: E731
    return as_int(output), as_int(states[0]) if states else None


@keras.saving.register_keras_serializable(package="keras_attention")
class AttentionRNNDecoder(recording.AttentionRecording, keras.layers.Layer):
    """The decoder of an RNN encoder-decoder with attention.

    At target step `t`, with `x_t` the embedded previous token, `h` the
    memory (the encoder states) and `f` the RNN cell:

    - `attention_style="bahdanau"` (Bahdanau et al., 2015): the query is the
      previous state, and the context is fed to the cell:

          c_t = attention(s_{t-1}, h);   s_t = f(s_{t-1}, [x_t; c_t])

      The output is `s_t`.
    - `attention_style="luong"` (Luong et al., 2015): the cell runs first,
      its state is the query, and the output is the attentional state:

          h_t = f(h_{t-1}, [x_t; h~_{t-1}]);   c_t = attention(h_t, h)
          h~_t = tanh(W_c [c_t; h_t])

      With `input_feeding=False`, `h~_{t-1}` is not fed back.

    Porting from TensorFlow Addons' `AttentionWrapper(cell, mechanism)`
    (the memory is given at each call here, not to the mechanism):

    - `attention_layer_size=None, output_attention=False` is our
      `attention_style="bahdanau"`: the context of `s_{t-1}` is fed to the
      cell with `x_t`, the output is `s_t` (TFA feeds a zero context at the
      first step, we attend with the initial state).
    - `attention_layer_size=units` (`output_attention=True`) is our
      `attention_style="luong", input_feeding=True`, except that TFA's
      attention layer is linear, `W_c [h_t; c_t]`, where ours applies
      `tanh` to `W_c [c_t; h_t]` as Luong et al. (eq. 5).
    - `BasicDecoder` is `call` (teacher forcing); `BeamSearchDecoder` is
      `step` driven by a `keras_hub` sampler (`BeamSampler`).

    `call` runs a whole target sequence (teacher forcing) in one loop
    (`keras.ops.scan`): it works under `tf.function`, `jit_compile=True`,
    in SavedModels and on JAX. `step` runs one step with the same weights
    (for greedy or beam search); decoding a sequence step by step gives the
    outputs of `call`. Padded target steps (`mask` False) carry the state
    unchanged and output zeros; the target mask is propagated.

    Args:
        units: int, size of the cell state (and of the output).
        attention: the attention layer, called with the query `(batch, 1,
            units)` of each step and the memory: `BahdanauAttention`,
            `LuongAttention` or any `Seq2SeqAttention` subclass (its
            `prepare_memory` runs once per source, its `attend` at each
            step), `CrossAttention` or `MultiHeadAttention` (these two:
            weights averaged over heads for the alignment history;
            keys/values projected once per source with `compute_cache`).
            Self-attention layers (`SelfAttention`, ...) are refused with
            a `ValueError`.
        cell: `"gru"`, `"lstm"`, or a Keras RNN cell with `state_size`
            (whose output size, and for the Bahdanau style first state
            size, must be `units`; checked at construction).
        attention_style: `"bahdanau"` or `"luong"`.
        input_feeding: bool, Luong style only: feed `h~_{t-1}` to the cell.
        return_attention_scores: bool, also return the alignment history.
        return_state: bool, also return the final states (as `step` takes
            them).
        dropout: float in [0, 1), dropout on the embedded inputs.
        kernel_initializer: initializer of `W_c` (Luong style) and of the
            cells built from a name.
        seed: optional int, seed of the dropout.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(batch, Tt, e)`, the embedded target sequence (shifted
            right: the token before each step).
        memory: `(batch, Ts, d)`, the encoder states.
        initial_state: optional cell state: a tensor `(batch, units)` (GRU)
            or a list `[h, c]` (LSTM), e.g. from `EncoderBridge`; zeros by
            default. Or the full state list that `step` takes.
        mask: optional boolean `(batch, Tt)` target mask (read from the
            Keras mask of `inputs` when omitted).
        memory_mask: optional boolean `(batch, Ts)` source mask (Keras mask).
        training: bool.

    Returns:
        `(batch, Tt, units)`, then, if `return_attention_scores`, the
        alignment history `(batch, Tt, Ts)`, then, if `return_state`, the
        final states.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> decoder = keras_attention.layers.AttentionRNNDecoder(
    ...     8, keras_attention.layers.BahdanauAttention(6))
    >>> y = np.ones((2, 4, 5), "float32")       # embedded targets
    >>> memory = np.ones((2, 7, 3), "float32")  # encoder states
    >>> tuple(decoder(y, memory).shape)
    (2, 4, 8)
    >>> states = decoder.get_initial_state(2)
    >>> out, states, weights = decoder.step(y[:, 0], states, memory)
    >>> tuple(out.shape), tuple(weights.shape)
    ((2, 8), (2, 7))

    References:
        - Bahdanau, Cho & Bengio, 2015, "Neural Machine Translation by
          Jointly Learning to Align and Translate".
        - Luong, Pham & Manning, 2015, "Effective Approaches to
          Attention-based Neural Machine Translation".
    """

    def __init__(
        self,
        units,
        attention,
        cell="gru",
        attention_style="bahdanau",
        input_feeding=True,
        return_attention_scores=False,
        return_state=False,
        dropout=0.0,
        kernel_initializer="glorot_uniform",
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        units = validation.check_positive_int("units", units)
        if isinstance(attention, dict):
            attention = keras.saving.deserialize_keras_object(attention)
        # The memory-mask keyword of a multi-head attention, looked up once
        # here rather than at every decoding step (None for Bahdanau/Luong).
        self._memory_mask_argument = _cross_mask_argument(attention)
        if not (
            isinstance(attention, Seq2SeqAttention)
            or self._memory_mask_argument is not None
        ):
            raise ValueError(
                "`attention` must be an encoder-decoder attention layer that "
                "the decoder calls as `attention(query, memory)`: "
                "`BahdanauAttention`, `LuongAttention` (or another "
                "`Seq2SeqAttention` subclass), `CrossAttention` or "
                "`MultiHeadAttention` (over the time axis) of "
                "`keras_attention.layers`. Self-attention layers "
                "(`SelfAttention`, `CausalSelfAttention`, "
                "`LocalSelfAttention`) attend within one sequence and cannot "
                f"read the memory. Received: attention={attention!r}"
            )
        if isinstance(cell, dict):
            cell = keras.saving.deserialize_keras_object(cell)
        if isinstance(cell, str):
            if cell not in CELLS:
                raise ValueError(
                    "`cell` must be 'gru', 'lstm' or an RNN cell layer. "
                    f"Received: cell={cell!r}"
                )
        elif not hasattr(cell, "state_size"):
            raise ValueError(
                "`cell` must be 'gru', 'lstm' or an RNN cell layer with a "
                f"`state_size`. Received: cell={cell!r}"
            )
        else:
            output_size, state_size = _cell_sizes(cell)
            # The cell's output is the decoder's output (and, Bahdanau
            # style, its first state is the attention query): both `units`.
            sizes = [output_size]
            if attention_style == "bahdanau":
                sizes.append(state_size)
            if any(n is not None and n != units for n in sizes):
                raise ValueError(
                    "`cell` must have output size (and, for "
                    "`attention_style='bahdanau'`, first state size) equal to "
                    f"`units`. Received: units={units!r}, cell={cell!r} with "
                    f"output size {output_size!r} and state_size="
                    f"{cell.state_size!r}"
                )
        is_style = (
            isinstance(attention_style, str) and attention_style in STYLES
        )
        if not is_style:
            raise ValueError(
                f"`attention_style` must be one of {STYLES}. "
                f"Received: attention_style={attention_style!r}"
            )
        dropout = validation.check_rate("dropout", dropout)
        self.units = units
        self.attention = attention
        self.cell = cell
        self.attention_style = attention_style
        self.input_feeding = validation.check_bool(
            "input_feeding", input_feeding
        )
        self.return_attention_scores = validation.check_bool(
            "return_attention_scores", return_attention_scores
        )
        self.return_state = validation.check_bool("return_state", return_state)
        self.dropout = dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.seed = validation.check_seed("seed", seed)
        self.supports_masking = True
        self._dropout_layer = keras.layers.Dropout(
            dropout, seed=self.seed, dtype=self.dtype_policy
        )

    # Structure.

    @property
    def _cross(self):
        return not isinstance(self.attention, Seq2SeqAttention)

    @property
    def _feeds(self):
        return self.attention_style == "luong" and self.input_feeding

    def _cell_state_sizes(self):
        return [int(s) for s in _as_list(self.rnn_cell.state_size)]

    def state_sizes(self):
        """Sizes of the decoder state list (cell states, then `h~` when it
        is fed back)."""
        return self._cell_state_sizes() + ([self.units] if self._feeds else [])

    def build(self, inputs_shape, memory_shape, initial_state_shape=None):
        self._built_features = (
            validation.check_sequence_shape(
                "inputs", inputs_shape, layout=_TARGET_LAYOUT
            ),
            validation.check_sequence_shape(
                "memory", memory_shape, layout=_MEMORY_LAYOUT
            ),
        )
        if isinstance(self.cell, str):
            self.rnn_cell = CELLS[self.cell](
                self.units,
                kernel_initializer=keras_utils.clone_initializer(
                    self.kernel_initializer
                ),
                dtype=self.dtype_policy,
                name=f"{self.cell}_cell",
            )
        else:
            self.rnn_cell = self.cell
        if self.attention.built:
            # The attention's query is the decoder state (`units`).
            features = getattr(
                self.attention,
                "_query_feature_dim" if self._cross else "_query_features",
                None,
            )
            if features is not None and features != self.units:
                raise ValueError(
                    "`attention` is already built for queries of size "
                    f"{features!r}; the decoder's queries are its states of "
                    f"size `units`. Received: units={self.units!r}, "
                    f"attention={self.attention!r}"
                )
        else:
            if self._cross:
                self.attention.build((None, 1, self.units), memory_shape)
            else:
                self.attention.build((None, self.units), memory_shape)
        context_dim = (
            self.attention.output_dim if self._cross else memory_shape[-1]
        )
        features = inputs_shape[-1]
        if self.attention_style == "bahdanau":
            cell_input = features + context_dim
        else:
            cell_input = features + (self.units if self._feeds else 0)
            self.attentional_dense = keras.layers.Dense(  # W_c
                self.units,
                activation="tanh",
                use_bias=False,
                kernel_initializer=keras_utils.clone_initializer(
                    self.kernel_initializer
                ),
                dtype=self.dtype_policy,
                name="attentional",
            )
            self.attentional_dense.build((None, context_dim + self.units))
        if not self.rnn_cell.built:
            self.rnn_cell.build((None, cell_input))
        self.built = True

    def _check_call_inputs(self, inputs, memory):
        """At call time: numeric `(batch, T, features)` inputs and memory
        of the feature sizes the decoder was built for."""
        features = getattr(self, "_built_features", (None, None))
        validation.check_call_input(
            "inputs", inputs, features[0], layout=_TARGET_LAYOUT
        )
        validation.check_call_input(
            "memory", memory, features[1], layout=_MEMORY_LAYOUT
        )

    # Step-by-step decoding.

    def prepare_memory(self, memory):
        """The attention's keys, computed once per source: pass them to
        `step` as `prepared_memory`."""
        if self._cross:
            return self.attention.compute_cache(memory)
        memory = ops.cast(memory, self.attention.compute_dtype)
        return self.attention._run_prepare_memory(memory, memory)

    def get_initial_state(self, batch_size, initial_state=None):
        """The state list `step` takes: the cell state(s) (`initial_state`,
        e.g. from `EncoderBridge`, or zeros), then a zero `h~_0` when it is
        fed back (Luong style)."""
        if initial_state is None:
            states = [
                ops.zeros((batch_size, n), self.compute_dtype)
                for n in self._cell_state_sizes()
            ]
        else:
            states = [
                ops.cast(s, self.compute_dtype) for s in _as_list(initial_state)
            ]
        if len(states) == len(self._cell_state_sizes()) and self._feeds:
            states.append(
                ops.zeros((batch_size, self.units), self.compute_dtype)
            )
        return states

    def _attend(self, query, prepared, memory, memory_mask, position, training):
        """One query `(b, d)` -> context `(b, dc)`, float32 weights
        `(b, Ts)`."""
        # expand_dims/squeeze, not slices: their gradients are reshapes
        # (one step's ops count: the loop is unrolled when short).
        query = ops.expand_dims(query, 1)
        if self._cross:
            mask_argument = {self._memory_mask_argument: memory_mask}
            context, scores, _ = self.attention(
                query,
                memory,
                cache=prepared,
                return_attention_scores=True,
                training=training,
                **mask_argument,
            )
            weights = ops.mean(ops.cast(scores, "float32"), axis=1)  # b 1 j
        else:
            # `attend` is not a Keras call: bring the inputs to the
            # attention's own compute dtype (it may differ from ours).
            dtype = self.attention.compute_dtype
            context, weights = self.attention._run_attend(
                ops.cast(query, dtype),
                prepared,
                ops.cast(memory, dtype),
                value_mask=memory_mask,
                training=training,
                positions=position,
            )
        context = ops.cast(ops.squeeze(context, 1), self.compute_dtype)
        return context, ops.squeeze(weights, 1)

    def _cell(self, x, states, training):
        output, new_states = self.rnn_cell(x, states, training=training)
        return output, _as_list(new_states)

    def _step(
        self, x, states, prepared, memory, memory_mask, position, training
    ):
        n = len(self._cell_state_sizes())
        cell_states = states[:n]
        if self.attention_style == "bahdanau":
            # c_t = a(s_{t-1}, h);  s_t = f(s_{t-1}, [x_t; c_t])
            context, weights = self._attend(
                cell_states[0],
                prepared,
                memory,
                memory_mask,
                position,
                training,
            )
            output, new_states = self._cell(
                ops.concatenate([x, ops.cast(context, x.dtype)], -1),
                cell_states,
                training,
            )
        else:
            # h_t = f(h_{t-1}, [x_t; h~_{t-1}]);  h~_t = tanh(W_c [c_t; h_t])
            cell_input = (
                ops.concatenate([x, states[n]], -1) if self._feeds else x
            )
            h, new_states = self._cell(cell_input, cell_states, training)
            context, weights = self._attend(
                h, prepared, memory, memory_mask, position, training
            )
            output = self.attentional_dense(
                ops.concatenate([ops.cast(context, h.dtype), h], -1)
            )
            if self._feeds:
                new_states = new_states + [output]
        return output, new_states, weights

    def step(
        self,
        inputs,
        states,
        memory,
        memory_mask=None,
        step_index=0,
        prepared_memory=None,
        training=None,
    ):
        """Runs one decoder step (for greedy or beam search).

        Args:
            inputs: `(batch, e)`, the embedded previous token.
            states: the state list from `get_initial_state`, a previous
                `step` or `call` with `return_state=True`.
            memory: `(batch, Ts, d)`, the encoder states.
            memory_mask: optional boolean `(batch, Ts)`.
            step_index: int or scalar tensor, the target step `t` (read by
                `LuongAttention(alignment="local-m")`).
            prepared_memory: optional `prepare_memory(memory)`, to process
                the memory once per source instead of at every step.
            training: bool.

        Returns:
            `(output, new_states, weights)`: `(batch, units)`, the new state
            list, and this step's attention weights `(batch, Ts)`.
        """
        recording.check_context_parallel(self)  # as `call` (the wrapper)
        validation.check_padding_mask(
            "memory_mask", memory_mask, memory, "memory"
        )
        if not self.built:
            self.build((None, 1, inputs.shape[-1]), tuple(memory.shape))
        features = getattr(self, "_built_features", (None, None))
        validation.check_call_input(
            "inputs", inputs, features[0], ranks=(2,), layout="(batch, e)"
        )
        validation.check_call_input(
            "memory", memory, features[1], layout=_MEMORY_LAYOUT
        )
        if prepared_memory is None:
            prepared_memory = self.prepare_memory(memory)
        states = [ops.cast(s, self.compute_dtype) for s in _as_list(states)]
        inputs = ops.cast(inputs, self.compute_dtype)
        output, new_states, weights = self._step(
            inputs,
            states,
            prepared_memory,
            memory,
            memory_mask,
            step_index,
            training,
        )
        return output, new_states, ops.cast(weights, self.compute_dtype)

    # Teacher forcing.

    def call(
        self,
        inputs,
        memory,
        initial_state=None,
        mask=None,
        memory_mask=None,
        training=None,
    ):
        self._check_call_inputs(inputs, memory)
        if mask is None:
            # Keras fills `mask` only for one-tensor calls: read the target
            # sequence's own Keras mask.
            mask = keras_utils.keras_mask(inputs)
        validation.check_padding_mask("mask", mask, inputs, "inputs")
        validation.check_padding_mask(
            "memory_mask", memory_mask, memory, "memory"
        )
        batch = ops.shape(inputs)[0]
        states = self.get_initial_state(batch, initial_state)
        prepared = self.prepare_memory(memory)
        x = (
            self._dropout_layer(inputs, training=training)
            if self.dropout
            else inputs
        )
        x = ops.cast(x, self.compute_dtype)
        # The loop carries the states, the step's output and (only when
        # returned) its attention weights; padded target steps keep the
        # previous state, and their outputs and weights are zeroed once,
        # after the loop.
        num_states = len(states)
        keep_weights = self.return_attention_scores
        init = tuple(states) + (ops.zeros((batch, self.units), x.dtype),)
        if keep_weights:
            init += (ops.zeros((batch, ops.shape(memory)[1]), x.dtype),)
        init += (ops.zeros((), "int32"),)  # t

        def advance(x_t, carry):
            old, t = list(carry[:num_states]), carry[-1]
            output, new, weights = self._step(
                x_t, old, prepared, memory, memory_mask, t, training
            )
            extra = (ops.cast(weights, x.dtype),) if keep_weights else ()
            return old, new, (output,) + extra + (t + 1,)

        if mask is None:

            def body(carry, x_t):
                _, new, rest = advance(x_t, carry)
                carry = tuple(new) + rest
                return carry, carry

            xs = ops.transpose(x, (1, 0, 2))  # t b e
        else:

            def body(carry, xs_t):
                x_t, m_t = xs_t
                old, new, rest = advance(x_t, carry)
                new = [ops.where(m_t, n, o) for n, o in zip(new, old)]
                carry = tuple(new) + rest
                return carry, carry

            # The inputs and the target mask, time-major.
            step_mask = ops.cast(mask, "bool")[..., None]  # b t 1
            xs = (
                ops.transpose(x, (1, 0, 2)),  # t b e
                ops.transpose(step_mask, (1, 0, 2)),  # t b 1
            )

        final, history = scan_carry(body, init, xs)
        outputs = (ops.transpose(history[num_states], (1, 0, 2)),)
        if keep_weights:
            outputs += (ops.transpose(history[num_states + 1], (1, 0, 2)),)
        if mask is not None:  # zeros at padded target steps
            outputs = tuple(
                ops.where(ops.cast(mask, "bool")[..., None], y, 0)
                for y in outputs
            )
        if self.return_state:
            outputs += tuple(final[:num_states])
        return outputs[0] if len(outputs) == 1 else outputs

    def compute_mask(self, inputs, previous_mask):
        return previous_mask

    def compute_output_spec(self, inputs, memory, initial_state=None, **kwargs):
        batch, steps = inputs.shape[0], inputs.shape[1]
        dtype = self.compute_dtype
        outputs = (keras.KerasTensor((batch, steps, self.units), dtype=dtype),)
        if self.return_attention_scores:
            outputs += (
                keras.KerasTensor((batch, steps, memory.shape[1]), dtype=dtype),
            )
        if self.return_state:
            if not self.built:
                self.build(inputs.shape, memory.shape)
            outputs += tuple(
                keras.KerasTensor((batch, n), dtype=dtype)
                for n in self.state_sizes()
            )
        return outputs[0] if len(outputs) == 1 else outputs

    def call_with_attention(self, call, args, kwargs, options):
        """`collect_attention`'s hook (`layers/recording.py`): `call`
        with the alignment history switched on; its weights
        `(batch, 1, Tt, Ts)` (heads averaged over a multi-head
        attention)."""
        arguments = inspect.signature(call).bind(*args, **kwargs).arguments
        asked = self.return_attention_scores
        self.return_attention_scores = True
        try:
            outputs = call(*args, **kwargs)
        finally:
            self.return_attention_scores = asked
        weights = recording.numpy_weights(outputs[1])[:, None]  # b 1 t s
        meta = dict(
            kind="decoder",
            query_mask=recording.padding_mask(
                arguments.get("mask"), arguments.get("inputs")
            ),
            key_mask=recording.padding_mask(
                arguments.get("memory_mask"), arguments.get("memory")
            ),
            causal=False,
            window=None,
            heads_averaged=isinstance(self.attention, MultiHeadAttention),
        )
        if not asked:
            outputs = recording.without_scores(outputs)
        return outputs, weights, meta

    def get_config(self):
        config = super().get_config()
        cell = self.cell
        if not isinstance(cell, str):
            cell = keras.saving.serialize_keras_object(cell)
        config.update(
            {
                "units": self.units,
                "attention": keras.saving.serialize_keras_object(
                    self.attention
                ),
                "cell": cell,
                "attention_style": self.attention_style,
                "input_feeding": self.input_feeding,
                "return_attention_scores": self.return_attention_scores,
                "return_state": self.return_state,
                "dropout": self.dropout,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "seed": self.seed,
            }
        )
        return config
