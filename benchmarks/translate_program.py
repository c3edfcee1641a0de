"""Whole program: the translate example's RNN + Bahdanau model vs Keras's.

    python benchmarks/translate_program.py [--steps 400] [--batch-size 64]
        [--repeats 7] [--jit] [--markdown FILE] [--quick]

Trains two models of the same architecture on the same batches of the
translate example's default data (human-written dates -> ISO 8601,
character tokens, `examples/translate/data.py`) and reports training
steps per second and held-out exact match after the same number of steps:

- ours: `examples.translate.model.RNNTranslator` with
  `attention="bahdanau"` (bidirectional GRU encoder, `EncoderBridge`,
  `AttentionRNNDecoder` + `BahdanauAttention`, one `keras.ops.scan` over
  the target steps), built by the example's own code; greedy decoding by
  the example's `generate` (a `keras_hub` sampler over the decoder's
  `step`).
- Keras: the same network from Keras's own parts, with the structure of
  the TensorFlow NMT tutorial ("Neural machine translation with
  attention"): bidirectional GRU encoder, a `Dense(tanh)` bridge of the
  two final states, and a decoder whose step attends with the previous
  state (`keras.layers.AdditiveAttention` over `W1 s + b` and the
  precomputed keys `W2 h`; its `scale` is Bahdanau's `v`), concatenates
  the context to the embedded token and runs a `GRUCell`; teacher forcing
  as the tutorial's training loop, one Python step per target position
  (unrolled in the graph); greedy decoding with a step loop.

Both have the same weights (the same number of parameters, printed);
unless `--independent-init`, the Keras model starts from a copy of ours,
and the first batch's logits are compared (max |diff| printed, must be
below 1e-4) before training. Both models are compiled as the example does
(Adam 2e-3 with clipnorm 1, masked sparse cross-entropy) and trained with
`train_on_batch` on the same list of batches (checked by hashing every
batch each model receives). Source lengths are padded up to a multiple of
8 (at most 5 distinct batch shapes); the first batch of every shape is
trained first, untimed (warm-up: tracing, XLA compilation); the remaining
steps run in `--repeats` interleaved blocks (ours k steps, Keras k steps,
alternating which goes first) and steps/s is k / the median block time.

Machine, library versions and `os.getloadavg()` are printed before and
after: numbers for publishing need an idle machine (1-minute load < 0.5).
"""

import argparse
import hashlib
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _timing import load_average  # noqa: E402
from _timing import machine_summary  # noqa: E402
from _timing import markdown_table  # noqa: E402
from keras import ops  # noqa: E402

from examples.translate.data import DATES  # noqa: E402
from examples.translate.data import encode_source  # noqa: E402
from examples.translate.data import encode_target  # noqa: E402
from examples.translate.data import make_pipelines  # noqa: E402
from examples.translate.model import PAD  # noqa: E402
from examples.translate.model import build_translator  # noqa: E402
from keras_attention.ops import compile_step  # noqa: E402

SOURCE_MULTIPLE = 8  # source lengths padded up to a multiple of this


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--jit", action="store_true", help="jit_compile")
    parser.add_argument("--markdown", help="write the table to this file")
    parser.add_argument(
        "--max-eval", type=int, default=1000, help="held-out examples"
    )
    parser.add_argument("--embedding-dim", type=int, default=64)
    parser.add_argument("--encoder-units", type=int, default=128)
    parser.add_argument("--decoder-units", type=int, default=256)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--independent-init",
        action="store_true",
        help="do not start the Keras model from a copy of our weights",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny data and model, a few steps (smoke test)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.steps = min(args.steps, 12)
        args.repeats = min(args.repeats, 2)
        args.batch_size = min(args.batch_size, 16)
        args.max_eval = min(args.max_eval, 32)
        args.embedding_dim, args.encoder_units, args.decoder_units = 16, 16, 32
    return args


# The Keras model: the TF NMT tutorial's structure, Keras parts only.


class TutorialDecoder(keras.layers.Layer):
    """The NMT tutorial's `Decoder` + `BahdanauAttention` (Bahdanau style):

        c_t = AdditiveAttention([W1 s_{t-1} + b, h, W2 h]);
        s_t = GRUCell([x_t; c_t], s_{t-1});   logits_t = W_o s_t + b_o

    `call` runs the teacher-forced targets with one Python step per
    position (the tutorial's training loop), `step` one step (greedy).
    """

    def __init__(self, vocabulary_size, embedding_dim, units, **kwargs):
        super().__init__(**kwargs)
        self.embedding = keras.layers.Embedding(
            vocabulary_size, embedding_dim, name="target_embedding"
        )
        self.w1 = keras.layers.Dense(units, name="query")  # W1 s + b
        self.w2 = keras.layers.Dense(units, use_bias=False, name="key")
        self.attention = keras.layers.AdditiveAttention(name="additive")
        self.cell = keras.layers.GRUCell(units, name="gru_cell")
        self.fc = keras.layers.Dense(
            vocabulary_size, dtype="float32", name="logits"
        )

    def prepare(self, memory):
        return self.w2(memory)  # b s u, once per source

    def step(self, token, state, memory, keys, memory_mask):
        query = self.w1(state)[:, None, :]  # b 1 u
        context = self.attention(
            [query, memory, keys], mask=[None, memory_mask]
        )[:, 0]  # b d
        x = ops.concatenate([self.embedding(token), context], axis=-1)
        output, new = self.cell(x, state)
        new = new[0] if isinstance(new, (list, tuple)) else new
        return self.fc(output), new

    def call(self, decoder_ids, memory, state, memory_mask):
        keys = self.prepare(memory)
        logits = []
        for t in range(decoder_ids.shape[1]):
            step_logits, state = self.step(
                decoder_ids[:, t], state, memory, keys, memory_mask
            )
            logits.append(step_logits)
        return ops.stack(logits, axis=1)  # b t vocabulary


class KerasTranslator:
    def __init__(
        self,
        source_vocabulary_size,
        target_vocabulary_size,
        target_steps,
        start_id,
        embedding_dim,
        encoder_units,
        decoder_units,
    ):
        self.start_id, self.target_steps = start_id, target_steps
        encoder_ids = keras.Input((None,), dtype="int32", name="encoder_ids")
        decoder_ids = keras.Input(
            (target_steps,), dtype="int32", name="decoder_ids"
        )
        x = keras.layers.Embedding(
            source_vocabulary_size,
            embedding_dim,
            mask_zero=True,
            name="source_embedding",
        )(encoder_ids)
        self.bigru = keras.layers.Bidirectional(
            keras.layers.GRU(
                encoder_units, return_sequences=True, return_state=True
            ),
            name="encoder_gru",
        )
        memory, forward_state, backward_state = self.bigru(x)
        self.bridge = keras.layers.Dense(
            decoder_units, activation="tanh", name="bridge"
        )
        state = self.bridge(
            keras.layers.Concatenate()([forward_state, backward_state])
        )
        self.encoder = keras.Model(encoder_ids, [memory, state])
        self.decoder = TutorialDecoder(
            target_vocabulary_size, embedding_dim, decoder_units
        )
        memory, state = self.encoder(encoder_ids)
        logits = self.decoder(
            decoder_ids, memory, state, ops.not_equal(encoder_ids, PAD)
        )
        self.model = keras.Model(
            {"encoder_ids": encoder_ids, "decoder_ids": decoder_ids}, logits
        )

    def generate(self, encoder_ids):
        """Greedy `(b, target_steps)` ids after [START] (a step loop)."""
        memory, state = self.encoder(encoder_ids)
        memory_mask = ops.not_equal(encoder_ids, PAD)
        keys = self.decoder.prepare(memory)
        token = ops.full((ops.shape(encoder_ids)[0],), self.start_id, "int32")
        tokens = []
        for _ in range(self.target_steps):
            logits, state = self.decoder.step(
                token, state, memory, keys, memory_mask
            )
            token = ops.cast(ops.argmax(logits, axis=-1), "int32")
            tokens.append(token)
        return ops.stack(tokens, axis=1)

    def copy_weights_from(self, ours):
        """Starts from `ours`'s weights (an `RNNTranslator`)."""
        model = ours.model
        self.encoder.get_layer("source_embedding").set_weights(
            model.get_layer("encoder")
            .get_layer("source_embedding")
            .get_weights()
        )
        encoder = model.get_layer("encoder")
        self.bigru.set_weights(encoder.get_layer("encoder_gru").get_weights())
        self.bridge.set_weights(
            encoder.get_layer("bridge").state_dense.get_weights()
        )
        decoder, attention = ours.decoder, ours.decoder.attention
        self.decoder.embedding.set_weights(ours.embedding.get_weights())
        self.decoder.w1.set_weights(
            [
                _numpy(attention.query_dense.kernel),
                _numpy(attention.attention_bias),
            ]
        )
        self.decoder.w2.set_weights([_numpy(attention.key_dense.kernel)])
        self.decoder.attention.set_weights([_numpy(attention.attention_v)])
        self.decoder.cell.set_weights(decoder.rnn_cell.get_weights())
        self.decoder.fc.set_weights(ours.head.get_weights())


# Data.


def _numpy(variable):
    return ops.convert_to_numpy(variable)


def pad_to(x, length):
    return np.pad(x, [(0, 0), (0, length - x.shape[1])])


def training_batches(data, count, target_steps, multiple=SOURCE_MULTIPLE):
    """`count` batches of the example's training pipeline (repeated), as
    NumPy; sources padded to a multiple of `multiple`, targets to
    `target_steps`;
    the first batch of each shape moved to the front. Returns the
    batches and the number of distinct shapes."""
    batches = []
    for features, labels in data.train.repeat().take(count):
        source = features["encoder_ids"].numpy()
        length = -(-source.shape[1] // multiple) * multiple
        batches.append(
            (
                {
                    "encoder_ids": pad_to(source, length),
                    "decoder_ids": pad_to(
                        features["decoder_ids"].numpy(), target_steps
                    ),
                },
                pad_to(labels.numpy(), target_steps),
            )
        )
    first, rest, seen = [], [], set()
    for batch in batches:
        shape = (len(batch[1]), batch[0]["encoder_ids"].shape[1])
        (rest if shape in seen else first).append(batch)
        seen.add(shape)
    return first + rest, len(first)


def held_out(data, count):
    """`(source ids (b, s), reference ids (b, t))` of the test pairs."""
    pairs = data.test_pairs[:count]
    sources = [
        encode_source(data.source_tokenizer, s, data.max_source_length)
        for s, _ in pairs
    ]
    targets = [
        encode_target(data.target_tokenizer, t, data.max_target_length)
        for _, t in pairs
    ]
    width = max(len(s) for s in sources) + 1
    source = np.zeros((len(pairs), width), "int32")
    target = np.zeros((len(pairs), data.max_target_length), "int32")
    for i, (s, t) in enumerate(zip(sources, targets)):
        source[i, : len(s)] = np.asarray(s)
        target[i, : len(t)] = np.asarray(t)
    return source, target


def until_end(row, end_id):
    row = list(row)
    return row[: row.index(end_id)] if end_id in row else row


def exact_match(generate, source, reference, end_id, batch=256):
    """% of held-out rows whose greedy tokens (up to [END]) equal the
    reference's; `generate(source)` gives the tokens after [START]."""
    hits = 0
    for i in range(0, len(source), batch):
        ids = np.asarray(generate(source[i : i + batch]))
        for hyp, ref in zip(ids, reference[i : i + batch]):
            hits += until_end(hyp, end_id) == until_end(ref[1:], end_id)
    return 100.0 * hits / len(source)


# Training and timing.


def digest(batch):
    features, labels = batch
    h = hashlib.sha1()
    for x in (features["encoder_ids"], features["decoder_ids"], labels):
        h.update(np.ascontiguousarray(x).tobytes())
    return h.hexdigest()


class Trainer:
    """`train_on_batch` over the shared batch list, recording what it
    received."""

    def __init__(self, model, batches):
        self.model, self.batches = model, batches
        self.position, self.seen, self.losses = 0, [], []

    def run(self, steps):
        for _ in range(steps):
            batch = self.batches[self.position]
            self.seen.append(digest(batch))
            self.losses.append(float(self.model.train_on_batch(*batch)))
            self.position += 1


def count_params(model):
    return int(sum(np.prod(w.shape) for w in model.trainable_weights))


def compile_model(model, args):
    model.compile(
        optimizer=keras.optimizers.Adam(args.learning_rate, clipnorm=1.0),
        loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, ignore_class=PAD
        ),
        jit_compile=bool(args.jit),
    )


def logits_difference(ours, theirs, batch):
    features, labels = batch
    a = ops.convert_to_numpy(ours(features))
    b = ops.convert_to_numpy(theirs(features))
    real = labels != PAD  # our decoder outputs zeros on padded steps
    return float(np.max(np.abs(a - b)[real]))


def main(argv=None):
    args = parse_args(argv)
    keras.utils.set_random_seed(args.seed)
    load_before = load_average()
    print(f"Machine: {machine_summary()}", flush=True)
    print(f"Load average before: {load_before}", flush=True)
    began = time.perf_counter()

    def phase(name):
        print(f"[{time.perf_counter() - began:6.1f} s] {name}", flush=True)

    data = make_pipelines(
        DATES, args.batch_size, quick=args.quick, seed=args.seed
    )
    _, start_id, end_id = data.special_ids
    target_steps = data.max_target_length - 1
    sizes = dict(
        embedding_dim=args.embedding_dim,
        encoder_units=args.encoder_units,
        decoder_units=args.decoder_units,
    )
    ours = build_translator(
        "rnn",
        source_vocabulary_size=data.source_tokenizer.vocabulary_size(),
        target_vocabulary_size=data.target_tokenizer.vocabulary_size(),
        max_source_length=data.max_source_length + 1,
        max_target_length=data.max_target_length,
        start_id=start_id,
        end_id=end_id,
        attention="bahdanau",
        dropout=0.0,
        jit_compile=bool(args.jit),
        **sizes,
    )
    theirs = KerasTranslator(
        data.source_tokenizer.vocabulary_size(),
        data.target_tokenizer.vocabulary_size(),
        target_steps,
        start_id,
        **sizes,
    )
    params = {
        "ours": count_params(ours.model),
        "keras": count_params(theirs.model),
    }
    phase("data and models ready")
    print(f"Trainable parameters: {params}", flush=True)

    # --quick: one source length (one trace of each training step).
    multiple = data.max_source_length if args.quick else SOURCE_MULTIPLE
    batches, shapes = training_batches(
        data, max(args.steps, 1), target_steps, multiple
    )
    if args.quick:
        batches = batches[: shapes + 2 * args.repeats]
    steps = len(batches)
    if not args.independent_init:
        theirs.copy_weights_from(ours)
        diff = logits_difference(ours.model, theirs.model, batches[0])
        print(f"First batch logits, max |ours - keras|: {diff:.2e}")
        if not diff < 1e-4:
            raise AssertionError(f"the two models differ by {diff}")
    else:
        diff = None
    compile_model(ours.model, args)
    compile_model(theirs.model, args)
    trainers = {
        "ours": Trainer(ours.model, batches),
        "keras": Trainer(theirs.model, batches),
    }

    # Warm-up: the first batch of every shape (tracing, compilation).
    warmup = min(shapes, steps)
    for trainer in trainers.values():
        trainer.run(warmup)
    phase("warm-up done")
    timed = steps - warmup
    repeats = max(1, min(args.repeats, timed))
    block = timed // repeats
    times = {name: [] for name in trainers}
    names = list(trainers)
    for r in range(repeats):
        extra = timed - block * repeats if r == repeats - 1 else 0
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            start = time.perf_counter()
            trainers[name].run(block + extra)
            times[name].append((time.perf_counter() - start) / (block + extra))
    if trainers["ours"].seen != trainers["keras"].seen:
        raise AssertionError("the two models were trained on other batches")
    print(
        f"Both trained on the same {steps} batches ({warmup} warm-up, "
        f"{repeats} timed blocks of {block})",
        flush=True,
    )

    phase("training done")
    source, reference = held_out(data, args.max_eval)
    generators = {
        "ours": compile_step(ours.generate, bool(args.jit)),
        "keras": compile_step(theirs.generate, bool(args.jit)),
    }

    def trim(name, ids):  # ours returns [START] first
        return np.asarray(ids)[:, 1:] if name == "ours" else ids

    rows = []
    for name in names:
        seconds = statistics.median(times[name])
        accuracy = exact_match(
            lambda s, g=generators[name], n=name: trim(n, g(s)),
            source,
            reference,
            end_id,
        )
        losses = trainers[name].losses
        rows.append(
            [
                name,
                params[name],
                steps,
                args.batch_size,
                "yes" if args.jit else "no",
                1.0 / seconds,
                seconds * 1e3,
                losses[0],
                float(np.mean(losses[-max(1, len(losses) // 10) :])),
                accuracy,
            ]
        )
    phase("evaluation done")
    ratio = rows[0][6] / rows[1][6]
    load_after = load_average()
    headers = [
        "model",
        "parameters",
        "steps",
        "batch",
        "jit",
        "steps/s",
        "ms/step",
        "first loss",
        "final loss",
        "exact match %",
    ]
    text = "\n".join(
        [
            f"Machine: {machine_summary()}.",
            f"Load average before: {load_before}; after: {load_after}.",
            f"Held-out: {len(source)} test pairs, greedy decoding. "
            f"First-batch logits max |diff| "
            f"{'n/a' if diff is None else f'{diff:.1e}'}.",
            "",
            markdown_table(headers, rows),
            "",
            f"Time per step ours/keras: {ratio:.3f} (<= 1: ours at least as "
            "fast)",
        ]
    )
    print(text)
    print(f"Load average after: {load_after}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    return rows


if __name__ == "__main__":
    main()
