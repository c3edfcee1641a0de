"""Every package of the library and the examples says what it exports."""

import ast
import pathlib

import pytest
import serving

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


# Subpackages for the package's own modules only (not part of the API).
INTERNAL = {"utils"}


def _subpackages():
    """The package's public subpackages and top-level modules."""
    package = ROOT / "keras_attention"
    names = {
        p.stem if p.is_file() else p.name
        for p in package.iterdir()
        if not p.name.startswith("_")
        and (p.suffix == ".py" or (p / "__init__.py").exists())
    }
    return sorted(names - INTERNAL)


def test_root_imports_every_subpackage():
    # `import keras_attention as ka; ka.visualization...` (as the README
    # writes it) needs the root to import each subpackage (issue 23).
    tree = ast.parse((ROOT / "keras_attention/__init__.py").read_text())
    assert sorted(_all_names(tree)) == _subpackages()


def test_subpackages_are_attributes_of_a_light_import():
    # In a fresh process on JAX, without matplotlib: every subpackage is an
    # attribute of the root, and TensorFlow is not loaded (the TensorBoard
    # callback imports it when it writes the first image).
    code = """
    import keras_attention as ka

    answer({
        "attributes": [
            name for name in ka.__all__
            if getattr(ka, name, None) is not None
        ],
        "calls": [
            callable(ka.visualization.collect_attention),
            callable(ka.distribution.get_layout_map),
        ],
        "tensorflow": "tensorflow" in sys.modules,
    })
    """
    got = serving.answer_in_fresh_process(
        code,
        blocked_modules=("matplotlib",),
        pythonpath=(serving.ROOT,),
        env={"KERAS_BACKEND": "jax"},
    )
    assert got == {
        "attributes": _subpackages(),
        "calls": [True, True],
        "tensorflow": False,
    }


def test_test_files_have_unique_names():
    # The suite's folders have no __init__.py: pytest imports each test
    # file as a top-level module named after the file, so two files of one
    # name in different folders fail with "import file mismatch" when one
    # process collects both (tests/run.sh's parts do).
    names = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {n: p for n, p in names.items() if len(p) > 1} == {}
