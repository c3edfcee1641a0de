"""Tests of `python -m examples.language_model --mixer ...` (issue 39,
item 5): the options refused at start-up (cheap, no Keras model), the
stacks each mixer builds, and a tiny comparison of two mixers whose
table has a row per mixer (the decoding measured in the test process;
the fresh processes of `examples.language_model.decoding`: the slow
end-to-end run).

`tf_only` as test_language_model.py: the example runs in the suite's
TensorFlow part.
"""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.tf_only


def _parse(argv):
    from examples.language_model.__main__ import parse_args

    return parse_args(argv)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--mixer", "linear", "--window", "32"], "--window 32"),
        (["--mixer", "gated_delta", "--window", "0"], "--window 0"),
        (["--mixer", "linear", "--positions", "rope"], "--positions 'rope'"),
        (["--mixer", "linear", "--positions", "alibi"], "--positions 'alibi'"),
        (["--mixer", "gated_delta", "--sink-tokens", "4"], "--sink-tokens 4"),
        (["--mixer", "linear", "--context-parallel", "8"], "--mixer linear"),
        (["--mixer", "hybrid", "--num-layers", "1"], "--num-layers 1"),
        (["--mixer", "attention", "linear", "--max-length", "64"],
         "--max-length 64"),
        (["--mixer", "attention", "linear", "--generate-only"],
         "--generate-only True"),
        (["--mixer", "attention", "linear", "--samplers", "greedy"],
         "--samplers 'greedy'"),
        (["--mixer", "attention", "linear", "--distribution", "data"],
         "--distribution 'data'"),
        (["--mixer", "attention", "linear", "--positions", "learned"],
         "--positions 'learned'"),
        (["--mixer", "linear", "--decode-length", "64"],
         "--decode-length 64"),
        (["--mixer", "attention", "linear", "--decode-length", "0"],
         "must be >= 1. Received: 0"),
    ],
)  # fmt: skip
def test_options_that_cannot_apply_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        _parse(argv)
    assert message in capsys.readouterr().err


def test_defaults_follow_the_mixers():
    args = _parse([])
    assert (args.mixer, args.window, args.positions) == (
        ["attention"],
        64,
        "rope",
    )
    # no attention block: no window, and no limit on the generated length
    args = _parse(["--mixer", "gated_delta", "--max-length", "1000"])
    assert (args.mixer, args.window, args.max_length) == (
        ["gated_delta"],
        0,
        1000,
    )
    assert _parse(["--mixer", "linear", "--positions", "sinusoidal"]).positions
    args = _parse(["--mixer", "linear", "hybrid", "linear", "--quick"])
    assert args.mixer == ["linear", "hybrid"]  # each once
    assert args.num_layers == 2  # a hybrid stack needs two blocks
    assert args.decode_length == 256
    assert _parse(["--mixer", "attention", "hybrid"]).decode_length == 32768
    # attention options apply to the attention blocks of a hybrid stack
    assert _parse(["--mixer", "hybrid", "--window", "16"]).window == 16


def test_hybrid_stacks_follow_qwen_3_5():
    from examples.language_model.options import layer_mixers

    assert layer_mixers("hybrid", 2) == ["gated_delta", "attention"]
    group = ["gated_delta"] * 3 + ["attention"]
    assert layer_mixers("hybrid", 8) == group * 2
    assert layer_mixers("hybrid", 5) == [
        "gated_delta", "gated_delta", "gated_delta", "attention", "attention"
    ]  # fmt: skip
    with pytest.raises(ValueError, match="num_layers=1"):
        layer_mixers("hybrid", 1)
    with pytest.raises(ValueError, match="mixer='mamba'"):
        layer_mixers("mamba", 2)


@pytest.mark.parametrize("mixer", ["linear", "gated_delta", "hybrid"])
def test_the_model_holds_the_mixers_asked_for(mixer):
    from examples.language_model.model import build_language_model
    from keras_attention.layers import GatedDeltaNet
    from keras_attention.layers import LinearAttention
    from keras_attention.layers import LocalSelfAttention

    model, generator = build_language_model(
        40, 16, hidden_dim=8, num_layers=2, num_heads=2, window=4, mixer=mixer
    )
    expected = {
        "linear": [LinearAttention] * 2,
        "gated_delta": [GatedDeltaNet] * 2,
        "hybrid": [GatedDeltaNet, LocalSelfAttention],
    }[mixer]
    layers = [type(block.self_attention) for block in generator.blocks]
    assert layers == expected


def test_linear_stacks_stream_and_show_what_the_explorer_can(tmp_path):
    from examples.language_model.__main__ import write_explorer
    from examples.language_model.model import build_language_model
    from examples.language_model.model import make_sampler
    from examples.language_model.model import stream_text

    model, generator = build_language_model(
        40, 16, hidden_dim=8, num_layers=2, num_heads=2, window=4,
        mixer="hybrid",
    )  # fmt: skip
    # --generate-only: a recurrent state and a ring, any length
    text = "".join(
        stream_text(generator, "ab", make_sampler("greedy"), 40, 40, piece=8)
    )
    assert len(text) == 40 - len("\nab")
    path, left_out = write_explorer(model, ["abc", "de"], 40, str(tmp_path))
    # the attention block is shown; only a gated delta net (weights that
    # can be negative) may be left out
    assert path is not None and (tmp_path / "attention.html").exists()
    assert set(left_out) <= {"decoder_block_0/self_attention"}


def _table(text):
    """The rows of the last Markdown table in `text`, split into cells."""
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("|")
    ]
    start = max(i for i, r in enumerate(rows) if r[0] == "mixer")
    return rows[start], rows[start + 2 :]


def test_quick_comparison_prints_a_row_per_mixer(tmp_path, capsys, monkeypatch):
    from examples.language_model import __main__ as language_model
    from examples.language_model import decoding

    # The decoding's fresh processes (imports, XLA: tens of seconds on
    # the loaded CI machine) run in this process here, without XLA; the
    # slow test below runs them as the example does.
    monkeypatch.setattr(
        decoding,
        "run_child",
        lambda config, weights, length, idle=False: decoding.child(
            config, weights, length, idle, jit_compile=False
        ),
    )
    results = language_model.main(
        [
            "--backend", "tensorflow", "--quick", "--epochs", "1",
            "--mixer", "gated_delta", "linear", "--decode-length", "16",
            "--sequence-length", "32", "--batch-size", "8",
            "--output-dir", str(tmp_path / "run"),
            "--data-dir", str(tmp_path / "tfds"),
        ]
    )  # fmt: skip
    header, rows = _table(capsys.readouterr().out)
    assert header[3:5] == ["bits/char at 32", "bits/char at 128"]
    assert [r[:2] for r in rows] == [["gated_delta", "G"], ["linear", "L"]]
    for row in rows:
        assert all(float(x.replace(",", "")) > 0 for x in row[2:7]), row
    for mixer in ("gated_delta", "linear"):
        result = results["results"][mixer]
        assert result["blocks"] == [mixer]
        assert result["decoding"]["characters"] == 16
    assert (tmp_path / "run" / "mixers.md").read_text().count("\n| ") == 3
    with open(tmp_path / "run" / "mixers.json") as f:
        saved = json.load(f)
    assert saved["linear"]["bits"] == results["results"]["linear"]["bits"]


@pytest.mark.slow(
    "the --mixer comparison end to end in a subprocess, decoding in fresh "
    "processes (52 s at load 3 on 2 cores): the options, the "
    "stacks and the table are the fast tests above'"
)
def test_quick_comparison_end_to_end(tmp_path):
    out = subprocess.run(
        [
            sys.executable, "-m", "examples.language_model",
            "--backend", "tensorflow", "--quick", "--epochs", "1",
            "--mixer", "attention", "hybrid",
            "--output-dir", str(tmp_path / "run"),
            "--data-dir", str(tmp_path / "tfds"),
        ],
        capture_output=True, text=True, timeout=900,
        cwd=__file__.rsplit("/tests/", 1)[0],
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    header, rows = _table(out.stdout)
    assert header[-1] == "peak MiB, 256 chars"
    assert [r[:2] for r in rows] == [["attention", "AA"], ["hybrid", "GA"]]
    for row in rows:
        assert float(row[6]) > 0  # ms per character
        float(row[7])  # MiB above the idle process: a number
