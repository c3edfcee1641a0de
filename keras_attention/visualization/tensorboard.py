"""A Keras callback that logs attention heatmaps to TensorBoard."""

import io

import keras
import numpy as np

from keras_attention.utils import validation
from keras_attention.visualization.collect import collect_attention
from keras_attention.visualization.collect import layer_names
from keras_attention.visualization.collect import select_attention_layers
from keras_attention.visualization.plot_attention import plot_attention


def _per_example(tokens, name, count):
    """`tokens` as one list of strings per probe example (or Nones)."""
    if tokens is None:
        return [None] * count
    tokens = list(tokens)
    if tokens and isinstance(tokens[0], str):
        tokens = [tokens]  # one probe example
    if len(tokens) < count:
        raise ValueError(
            f"`{name}` must hold one token list per probe example ({count}). "
            f"Received: {len(tokens)} lists"
        )
    return [[str(t) for t in example] for example in tokens]


def _length(mask, example, size):
    """Real positions of one example (all of them without a mask)."""
    if mask is None:
        return size
    return max(int(np.asarray(mask)[example].sum()), 1)


def _labels(side, tokens, target_tokens, example, length):
    """Row or column labels: the example's tokens, else positions."""
    if side is None:
        return ["query"]
    chosen = target_tokens if side == "target_tokens" else tokens
    if chosen[example] is None or len(chosen[example]) < length:
        return [str(i) for i in range(length)]
    return chosen[example][:length]


def _png(fig):
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


class AttentionTensorBoard(keras.callbacks.Callback):
    """Logs the attention heatmaps of fixed probe inputs to TensorBoard.

    Every `every_n_epochs` epochs, runs `collect_attention(model,
    probe_inputs)` and writes one image per attention layer and probe
    example (its weights averaged over heads, padding cut off, tokens on
    the axes), tagged `attention/<layer path>/example_<i>` at step `epoch`
    (0-based, as Keras's `TensorBoard` callback), so that TensorBoard's
    Images tab shows alignment emerge during `fit`. With `heads="each"`,
    one image per head is also written (`.../head_<h>`).

    Images are written with `tf.summary.image` (TensorFlow is a dependency
    of the package, so this works on every Keras backend); the heatmaps
    are drawn with matplotlib (`plot_attention`). Start TensorBoard with
    `tensorboard --logdir <log_dir>`.

    Args:
        log_dir: directory of the event files (created if missing); the
            images go to its `attention` subdirectory.
        probe_inputs: what the model is called with, a small fixed batch
            (e.g. a few tokenized sentences).
        every_n_epochs: int, log at the end of every N-th epoch (epochs
            `N - 1`, `2N - 1`, ... counted from 0).
        tokens: optional token strings of the source (or only) sequence,
            one list per probe example (or one list for one example); axes
            show positions without them.
        target_tokens: optional token strings of the target sequence of an
            encoder-decoder model, one list per probe example.
        layers: optional name or list of names of attention layers (or of
            enclosing layers) to log; all by default (see
            `collect_attention`). Checked when training starts: a name
            that matches no attention layer of the model raises a
            `ValueError` before the first batch.
        max_examples: int, log at most the first this many probe examples.
        heads: `"mean"` (one image per layer and example, heads averaged)
            or `"each"` (also one image per head).
        dpi: resolution of the images.

    Example:

    >>> import tempfile
    >>> import numpy as np
    >>> import keras
    >>> import keras_attention
    >>> from keras_attention.visualization import AttentionTensorBoard
    >>> ids = keras.Input((None,), dtype="int32")
    >>> x = keras.layers.Embedding(20, 8, mask_zero=True)(ids)
    >>> x = keras_attention.layers.SelfAttention(2, 4, name="attention")(x)
    >>> x = keras_attention.layers.AttentionPooling(name="pool")(x)
    >>> model = keras.Model(ids, keras.layers.Dense(1)(x))
    >>> model.compile("adam", "mse")
    >>> probe = np.array([[3, 4, 5, 0]])
    >>> log_dir = tempfile.mkdtemp()
    >>> callback = AttentionTensorBoard(
    ...     log_dir, probe, tokens=[["the", "cat", "sat"]])
    >>> history = model.fit(np.array([[1, 2, 3, 4]]), np.zeros((1, 1)),
    ...                     epochs=1, verbose=0, callbacks=[callback])
    >>> callback.tags
    ['attention/attention/example_0', 'attention/pool/example_0']

    References:
        - Bahdanau et al., 2015, "Neural Machine Translation by Jointly
          Learning to Align and Translate" (alignment heatmaps).
        - Keras's `keras.callbacks.TensorBoard` and TensorFlow's
          `tf.summary.image`.
    """

    def __init__(
        self,
        log_dir,
        probe_inputs,
        every_n_epochs=1,
        tokens=None,
        target_tokens=None,
        layers=None,
        max_examples=3,
        heads="mean",
        dpi=80,
    ):
        super().__init__()
        validation.check_positive_int("every_n_epochs", every_n_epochs)
        validation.check_positive_int("max_examples", max_examples)
        validation.check_positive_int("dpi", dpi)
        if heads not in ("mean", "each"):
            raise ValueError(
                f'`heads` must be "mean" or "each". Received: heads={heads!r}'
            )
        self.log_dir = str(log_dir)
        self.probe_inputs = probe_inputs
        self.every_n_epochs = every_n_epochs
        self.tokens = tokens
        self.target_tokens = target_tokens
        layer_names(layers)  # its type now; the names at on_train_begin
        self.layers = layers
        self.max_examples = max_examples
        self.heads = heads
        self.dpi = dpi
        self.tags = []  # the tags written at the last logging epoch
        self._writer = None

    def _file_writer(self):
        # TensorFlow (a dependency) is imported when the first image is
        # written, not with `keras_attention.visualization`: on JAX or
        # PyTorch it would cost seconds for users who never log images.
        import tensorflow as tf

        if self._writer is None:
            self._writer = tf.summary.create_file_writer(
                f"{self.log_dir}/attention"
            )
        return self._writer

    def on_train_begin(self, logs=None):
        # The names in `layers` are checked against the model's attention
        # layers now, not after a whole epoch (the probe builds a model
        # whose blocks create their attention layers in `build`).
        select_attention_layers(self.model, self.layers, self.probe_inputs)

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every_n_epochs:
            return
        self.log_attention(epoch)

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def log_attention(self, step):
        """Collects the probe's attention now and writes its images at
        `step`; returns the tags written."""
        import tensorflow as tf

        maps = collect_attention(self.model, self.probe_inputs, self.layers)
        self.tags = []
        writer = self._file_writer()
        with writer.as_default():
            for name, weights in maps.items():
                for tag, png in self._images(name, weights, maps.metadata):
                    image = tf.io.decode_png(png, channels=4)[None]
                    tf.summary.image(tag, image, step=step)
                    self.tags.append(tag)
        writer.flush()
        return self.tags

    def _images(self, name, weights, metadata):
        """`(tag, PNG bytes)` of one layer's entry."""
        meta = metadata.get(name, {})
        count = min(self.max_examples, weights.shape[0])
        tokens = _per_example(self.tokens, "tokens", count)
        target = _per_example(self.target_tokens, "target_tokens", count)
        for example in range(count):
            rows = _length(meta.get("query_mask"), example, weights.shape[2])
            cols = _length(meta.get("key_mask"), example, weights.shape[3])
            row_labels = _labels(
                meta.get("query_tokens", "tokens"),
                tokens,
                target,
                example,
                rows,
            )
            col_labels = _labels(
                meta.get("key_tokens", "tokens"), tokens, target, example, cols
            )
            panels = [("", weights[example].mean(0))]
            if self.heads == "each":
                panels += [
                    (f"/head_{h}", w) for h, w in enumerate(weights[example])
                ]
            for suffix, matrix in panels:
                fig = plot_attention(
                    matrix[:rows, :cols],
                    col_labels,
                    row_labels,
                    title=f"{name} (example {example}{suffix})",
                    dpi=self.dpi,
                )
                fig.axes[0].set_xlabel("keys")
                fig.axes[0].set_ylabel("queries")
                yield f"attention/{name}/example_{example}{suffix}", _png(fig)
