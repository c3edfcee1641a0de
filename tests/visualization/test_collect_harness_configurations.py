"""`collect_attention` on the model of every layer test's configuration.

The configurations are the ones the layer tests hand to the shared
harness (`harness.run_layer_test(layer_cls, init_kwargs, input_data,
call_kwargs)`, global tokens included): they are gathered by running each
such test function with `run_layer_test` replaced by a recorder (which
stops the test there), so a configuration added to a layer test is
covered here without a second list. Each is built into the functional
model the harness builds (`harness._make_model`: one `keras.Input` per
tensor argument) and `collect_attention` runs on it:

- a model without an attention layer gives no entry (and no error);
- every entry is finite, of the shape its metadata gives, zero on padded
  keys and padded queries, and each row sums to 1 or to 0 (the linear-time
  mixers' implied weights, o = W v, need not: they are zero above the
  diagonal of a causal layer instead);
- where the layer or block returns its weights itself
  (`return_attention_scores` among the call arguments), the entries equal
  them (banded scores made dense, pooling and additive ones given their
  heads and query axes).
"""

import importlib.util
import inspect
import itertools
import pathlib

import harness
import numpy as np
import pytest
from keras import ops

from keras_attention.layers import AttentionPooling
from keras_attention.layers import GatedDeltaNet
from keras_attention.layers import LinearAttention
from keras_attention.layers import LocalSelfAttention
from keras_attention.layers import LuongAttention
from keras_attention.layers import Seq2SeqAttention
from keras_attention.visualization import collect
from keras_attention.visualization import collect_attention

TESTS = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = ("layers", "blocks", "ops")
ATOL = 2e-5


class _Recorded(Exception):
    """Raised by the recorder: the test stops at `run_layer_test`."""


def _parametrizations(function):
    """Keyword arguments for every parametrization of a test function;
    None when it takes arguments that no `parametrize` mark gives."""
    sets = []
    for mark in getattr(function, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names, values = mark.args[:2]
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        rows = []
        for value in values:
            value = getattr(value, "values", value)  # pytest.param
            value = value if len(names) > 1 else (value,)
            rows.append(dict(zip(names, value)))
        sets.append(rows)
    combos = [
        {k: v for row in combo for k, v in row.items()}
        for combo in itertools.product(*sets)
    ]
    wanted = set(inspect.signature(function).parameters)
    if any(set(kwargs) != wanted for kwargs in combos):
        return None
    return combos


def _harness_configurations():
    """`(id, layer_cls, init_kwargs, input_data, call_kwargs)` of every
    `run_layer_test` call in the layer, block and ops tests."""
    configurations = []
    for path in sorted(
        p for f in FOLDERS for p in (TESTS / f).glob("test_*.py")
    ):
        if "run_layer_test(" not in path.read_text():
            continue
        spec = importlib.util.spec_from_file_location(
            f"_harness_configurations_{path.stem}", path
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for name, function in list(vars(module).items()):
            if not name.startswith("test_") or not callable(function):
                continue
            if "run_layer_test(" not in inspect.getsource(function):
                continue
            combos = _parametrizations(function)
            if combos is None:
                raise ValueError(
                    f"{path.name}::{name} takes arguments other than its "
                    "parametrizations: teach _parametrizations about them"
                )
            for kwargs in combos:
                found = []

                def recorder(
                    layer_cls,
                    init_kwargs,
                    input_data,
                    call_kwargs=None,
                    *args,
                    found=found,
                    **options,
                ):
                    found.append(
                        (layer_cls, init_kwargs, input_data, call_kwargs)
                    )
                    raise _Recorded

                module.run_layer_test = recorder
                try:
                    function(**kwargs)
                except _Recorded:
                    pass
                suffix = "-".join(map(str, kwargs.values()))
                test_id = f"{path.stem}::{name}" + (
                    f"[{suffix}]" if suffix else ""
                )
                configurations += [(test_id, *found[0])] if found else []
    return configurations


CONFIGURATIONS = _harness_configurations()


def test_every_layer_test_configuration_is_gathered():
    # Not a gatherer that finds nothing: the layer tests have dozens.
    assert len(CONFIGURATIONS) >= 30
    ids = [c[0] for c in CONFIGURATIONS]
    assert any("global" in i for i in ids)  # global tokens included


def _as_dense(layer, scores):
    """A layer's own scores in `collect_attention`'s layout."""
    if isinstance(layer, LocalSelfAttention):
        scores = layer.scores_to_dense(scores)
    scores = np.asarray(ops.convert_to_numpy(scores), "float32")
    if isinstance(layer, AttentionPooling):
        return scores[:, None, None, :]
    if isinstance(layer, Seq2SeqAttention):
        return scores[:, None] if scores.ndim == 3 else scores[:, None, None]
    return scores


def _gaussian(model):
    """Whether a `LuongAttention(alignment="local-p")` is in `model`: its
    Gaussian scales the weights, rows sum to less than 1."""
    return any(
        isinstance(layer, LuongAttention) and layer.alignment == "local-p"
        for layer in model._flatten_layers()
    )


def _linear_mixer(model):
    """Whether a linear-time mixer is in `model`: its recorded weights are
    the matrix its output implies (o = W v), not a distribution."""
    return any(
        isinstance(layer, (LinearAttention, GatedDeltaNet))
        for layer in model._flatten_layers()
    )


def _sinks(model):
    """Whether an attention layer of `model` has learned sinks: a row's
    weights sum to 1 minus the sink's share."""
    return any(
        getattr(layer, "learned_sinks", False)
        for layer in model._flatten_layers()
    )


def _check_entry(weights, meta, mixing):
    batch, heads, rows, keys = weights.shape
    assert (meta["num_heads"], meta["query_length"], meta["key_length"]) == (
        heads,
        rows,
        keys,
    )
    assert np.all(np.isfinite(weights))
    if meta["key_mask"] is not None:
        padded = np.broadcast_to(
            ~meta["key_mask"][:, None, None, :], weights.shape
        )
        assert np.all(weights[padded] == 0)
    if meta["query_mask"] is not None:
        padded = ~meta["query_mask"]
        assert np.all(weights.transpose(0, 2, 1, 3)[padded] == 0)
    if mixing == "linear":  # o = W v: any real weights, none ahead.
        if meta["causal"] and rows == keys:
            assert np.all(np.triu(weights, k=1) == 0)
        return
    sums = weights.sum(-1)
    if mixing == "partial":  # Gaussian or sinks: part of the mass.
        assert np.all((sums <= 1 + 1e-5) & (sums >= 0))
    else:
        one = np.isclose(sums, 1, atol=1e-5)
        assert np.all(np.isclose(sums, 0, atol=1e-5) | one)


@pytest.mark.parametrize(
    "configuration", CONFIGURATIONS, ids=[c[0] for c in CONFIGURATIONS]
)
def test_collect_attention_on_each_harness_configuration(configuration):
    _, layer_cls, init_kwargs, input_data, call_kwargs = configuration
    call_kwargs = dict(call_kwargs or {})
    input_data = {k: np.asarray(v) for k, v in input_data.items()}
    model = harness._make_model(
        layer_cls(**init_kwargs), input_data, call_kwargs
    )
    inputs = list(input_data.values())
    maps = collect_attention(model, inputs)
    found = collect.attention_layers(model)
    if not found:
        assert maps == {}
        return
    assert maps, "attention layers but no entry"
    assert len(maps) >= len(found)
    mixing = "softmax"
    if _gaussian(model) or _sinks(model):
        mixing = "partial"
    elif _linear_mixer(model):
        mixing = "linear"
    for name, weights in maps.items():
        _check_entry(weights, maps.metadata[name], mixing)
    if not call_kwargs.get("return_attention_scores"):
        return
    # The layer's (or block's) own weights follow its first output, in
    # call order (a decoder block: self-attention, then cross-attention).
    scores = list(model(inputs))[1:]
    assert len(scores) == len(maps)
    by_path = {path: layer for path, layer, _ in found}
    for (name, weights), own in zip(maps.items(), scores):
        layer = by_path[maps.metadata[name]["path"]]
        np.testing.assert_allclose(
            weights, _as_dense(layer, own), atol=ATOL, err_msg=name
        )
