"""The supported keras-hub backbones are listed once: the converters'
registry (`interop.convert.CONVERTERS`). Every other place that names them
(the package docstring, the guide's table, a docs page per family, the
docs navigation, the equality tool, the tests) is compared with it here,
so adding a converter without them, or leaving a removed one in them,
fails this test. Backend-neutral text checks: TensorFlow part only."""

import pathlib
import re

import hf_cases
import keras_hub
import pytest
from pretrained_guide import guide_rows

import keras_attention
from keras_attention.interop import convert
from keras_attention.interop import huggingface

pytestmark = pytest.mark.tf_only("text checks: one backend is enough")

ROOT = pathlib.Path(__file__).resolve().parents[2]
REGISTERED = tuple(sorted(convert.CONVERTERS))


def _read(path):
    return (ROOT / path).read_text(encoding="utf-8")


def _is_supported(name):
    """A keras-hub backbone class that `from_keras_hub` converts (a
    registered class or a subclass of one)."""
    cls = getattr(keras_hub.models, name, None)
    bases = [getattr(keras_hub.models, n) for n in REGISTERED]
    return isinstance(cls, type) and issubclass(cls, tuple(bases))


def _backbone_names(text):
    return set(re.findall(r"\b([A-Z][A-Za-z0-9_]*Backbone)\b", text))


def test_supported_backbones_is_the_registry():
    assert keras_attention.interop.supported_backbones() == list(REGISTERED)
    for name in REGISTERED:
        assert isinstance(getattr(keras_hub.models, name, None), type), name


def test_package_docstring_names_every_converter_module():
    doc = keras_attention.interop.__doc__
    for name, converter in convert.CONVERTERS.items():
        module = converter.__module__.rsplit(".", 1)[-1]
        assert f"`{module}`" in doc, (name, module)


def test_guide_table_lists_exactly_the_supported_backbones():
    # Backbone class(es) | converter | our blocks.
    table = {
        name: row
        for row in guide_rows("Supported backbones")
        for name in _backbone_names(row[0])
    }
    assert set(REGISTERED) <= set(table), set(REGISTERED) - set(table)
    unsupported = [name for name in table if not _is_supported(name)]
    assert not unsupported, unsupported
    for name, converter in convert.CONVERTERS.items():
        assert converter.__name__ in table[name][1], (name, table[name])


def _nav_pages():
    return set(re.findall(r"(pretrained/[\w-]+\.md)", _read("mkdocs.yml")))


def test_a_docs_page_per_family_in_the_navigation():
    pages = {
        f"pretrained/{path.name}": _backbone_names(path.read_text("utf-8"))
        for path in sorted((ROOT / "docs" / "pretrained").glob("*.md"))
    }
    assert set(pages) == _nav_pages()
    for name in REGISTERED:
        assert any(name in names for names in pages.values()), name
    for page, names in pages.items():
        assert names & set(REGISTERED), f"{page} names no supported backbone"


@pytest.mark.parametrize(
    "path",
    [
        "tools/interop_equality.py",
        *sorted(
            str(p.relative_to(ROOT))
            for p in (ROOT / "tests/interop").glob("*.py")
        ),
    ],
)
def test_only_supported_backbones_are_built(path):
    built = set(re.findall(r"\b([A-Z]\w*Backbone)\(", _read(path)))
    assert all(_is_supported(name) for name in built), built


def test_every_backbone_is_checked_for_equality():
    """The equality tool and the interop tests each build every
    registered backbone (or a subclass)."""
    tool = _read("tools/interop_equality.py")
    tests = "".join(
        p.read_text("utf-8") for p in (ROOT / "tests/interop").glob("*.py")
    )
    for text in (tool, tests):
        built = set(re.findall(r"\b([A-Z]\w*Backbone)\(", text))
        for name in REGISTERED:
            base = getattr(keras_hub.models, name)
            assert any(
                issubclass(getattr(keras_hub.models, b), base) for b in built
            ), name


def test_generated_equality_table_has_a_row_per_backbone():
    """`tools/interop_equality.py --markdown` wrote a row (naming its
    backbone class) for every registered backbone, with logits and
    greedy figures for every family with a keras-hub `CausalLM`; the
    guide includes that table."""
    path = "docs/_generated/interop_equality.md"
    assert f'--8<-- "{path}"' in _read("docs/guides/pretrained.md")
    rows = [line for line in _read(path).splitlines() if "Backbone`" in line]
    built = {
        name: row for row in rows for name in _backbone_names(row.split("|")[1])
    }
    assert all(_is_supported(name) for name in built), built
    for name in REGISTERED:
        base = getattr(keras_hub.models, name)
        covering = [
            row
            for b, row in built.items()
            if issubclass(getattr(keras_hub.models, b), base)
        ]
        assert covering, name
        task = name.replace("Backbone", "CausalLM")
        if hasattr(keras_hub.models, task):
            cells = [row.split("|")[3:5] for row in covering]
            assert all("—" not in "".join(c) for c in cells), (name, cells)


# `from_huggingface`'s model types: the registry `huggingface.MODEL_TYPES`.
MODEL_TYPES = tuple(sorted(huggingface.MODEL_TYPES))


def _model_types(text):
    return set(re.findall(r"`([a-z0-9_]+)`", text))


def test_supported_model_types_is_the_registry():
    assert keras_attention.interop.supported_model_types() == list(MODEL_TYPES)


def test_checkpoint_guide_lists_exactly_the_model_types():
    """One row per model type in the guide's "Supported model types"
    table, naming its converter; the README's table names them too."""
    text = _read("docs/guides/checkpoints.md")
    section = text.split("## Supported model types", 1)[1].split("\n## ")[0]
    rows = {
        row.split("|")[1].strip().strip("`"): row
        for row in section.splitlines()
        if row.startswith("| `") and not row.startswith("| `model_type`")
    }
    assert sorted(rows) == list(MODEL_TYPES)
    for model_type, converter in huggingface.MODEL_TYPES.items():
        assert converter.__name__ in rows[model_type], model_type
    readme = _read("README.md").split("## Pretrained checkpoints", 1)[1]
    readme = readme.split("\n## ")[0]
    table = "".join(r.split("|")[1] for r in readme.splitlines() if "| `" in r)
    assert _model_types(table) - {"model_type"} == set(MODEL_TYPES)


def test_every_model_type_has_a_case_and_a_measured_row():
    """`tests/interop/hf_cases.py` has a case of every model type (the
    tests and the equality tool run them all), and the generated table
    the guide includes has a row for each."""
    assert {c["model_type"] for c in hf_cases.CASES.values()} == set(
        MODEL_TYPES
    )
    path = "docs/_generated/hf_equality.md"
    assert f'--8<-- "{path}"' in _read("docs/guides/checkpoints.md")
    rows = [r for r in _read(path).splitlines() if r.startswith("| `")]
    assert {r.split("`")[1] for r in rows} == set(MODEL_TYPES)
