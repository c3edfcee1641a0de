"""Every package of the library and the examples says what it exports."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
INITS = sorted(
    p.relative_to(ROOT).as_posix()
    for folder in ("keras_attention", "examples")
    for p in (ROOT / folder).rglob("__init__.py")
)


def _all_names(tree):
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return [ast.literal_eval(e) for e in node.value.elts]
    return None


def _imported_names(tree):
    """Names the package imports from itself (its public surface); helper
    imports of the standard library (e.g. `importlib` for a lazy alias) are
    not exports."""
    names = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module.startswith(
            ("keras_attention", "examples")
        ):
            names += [a.asname or a.name for a in node.names]
    return names


def test_there_are_packages():
    assert "keras_attention/__init__.py" in INITS
    assert "examples/translate/__init__.py" in INITS


@pytest.mark.parametrize("path", INITS)
def test_init_has_all_listing_exactly_its_imports(path):
    tree = ast.parse((ROOT / path).read_text())
    names = _all_names(tree)
    assert names is not None, f"{path} has no __all__"
    assert sorted(names) == sorted(_imported_names(tree)), path
