"""The package's layout rules, read from the source with `ast` (no import).

- One-way dependency order: utils <- masks <- ops <- mods <- layers <-
  blocks <- generation; `visualization` (a leaf) may import utils, masks,
  ops, mods and layers. No module imports from a later level (nor from
  the package root, which imports everything).
- No module imports a private (`_x`) name from another module. A private
  *module* may be imported by the modules of its own subpackage only
  (`keras_attention.ops._backend` from `keras_attention.ops.*`).
- No import inside a function (to dodge a cycle or hide a dependency),
  except of optional third-party packages where they belong: the backend
  libraries in the backend dispatch modules (`ops/_backend.py` and its
  `ops/_backend_<topic>.py` parts, `BACKEND_DISPATCH`), matplotlib in
  `visualization`, keras-hub (an optional extra) anywhere.
- No import cycle between the package's modules.
- Imports by name (`importlib.import_module("keras_attention.x")`,
  `__import__(...)`) count as imports for all of the above; one whose
  name is not a string literal is refused (the checks could not see it).
- No `assert` statement in library code (`python -O` strips them: checks
  raise `ValueError`).

Each test lists every violation (module, line, statement), not the first.
"""

import ast
import pathlib

import pytest

PACKAGE = "keras_attention"
ROOT = pathlib.Path(__file__).resolve().parents[1] / PACKAGE

# Dependency levels: a module may import from its own level or lower ones.
LEVELS = {
    "utils": 0,
    "masks": 1,
    "ops": 2,
    "mods": 3,
    "scores": 3,
    "layers": 4,
    "blocks": 5,
    "generation": 6,
    "distribution": 6,
    "interop": 6,
}
# Leaves outside the chain, and what they may import.
LEAVES = {
    "visualization": {"utils", "masks", "ops", "mods", "scores", "layers"}
}

# The backend dispatch: `ops/_backend.py` and the parts split from it (one
# topic each), the only modules that import the backend libraries.
BACKEND_DISPATCH = (
    "keras_attention.ops._backend",
    "keras_attention.ops._backend_flex",  # FlexAttention (PyTorch)
    "keras_attention.ops._backend_autograd",  # custom gradients, vjp
)

# Optional third-party packages a function may import lazily, and where.
LAZY_IMPORTS = {
    # visualization: the TensorBoard callback's image writer only (importing
    # `keras_attention.visualization` must not load TensorFlow on JAX/torch)
    "tensorflow": (
        *BACKEND_DISPATCH,
        "keras_attention.visualization.tensorboard",
    ),
    # distribution/_jax_ring: ring attention is JAX SPMD code throughout
    # (shard_map, ppermute, custom_vjp), not a backend switch (its
    # docstring says why it is not in ops/_backend.py)
    "jax": (
        *BACKEND_DISPATCH,
        "keras_attention.distribution._jax_ring",
    ),
    "torch": BACKEND_DISPATCH,
    "matplotlib": ("keras_attention.visualization",),
    "keras_hub": (PACKAGE,),
    # `from_huggingface("hf://...")`'s download: an optional extra
    "huggingface_hub": ("keras_attention.interop.huggingface",),
}


def _module_name(path):
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_package(name):
    return (ROOT.parent / name.replace(".", "/") / "__init__.py").exists()


def _is_module(name):
    path = ROOT.parent / name.replace(".", "/")
    return path.with_suffix(".py").exists() or _is_package(name)


def _modules():
    """`{module name: parsed tree}` of every module but the package root."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        name = _module_name(path)
        if name != PACKAGE:
            out[name] = ast.parse(path.read_text(), filename=str(path))
    return out


MODULES = _modules()


def _resolve(module, node):
    """Absolute module an `ImportFrom` reads from (relative ones too)."""
    if not node.level:
        return node.module
    base = module.split(".")
    if not _is_package(module):
        base = base[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _dynamic_import_name(node):
    """The module name of an `importlib.import_module(name)` or
    `__import__(name)` call; "" when the name is not a string literal;
    None for any other node."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    dynamic = (isinstance(func, ast.Name) and func.id == "__import__") or (
        isinstance(func, ast.Attribute) and func.attr == "import_module"
    )
    if not dynamic:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    return ""


def _imports(module, tree):
    """`(node, source module, imported name or None, target)` of every
    import of the package: `target` is the module the import loads (a
    submodule when the name is one). Imports by name
    (`importlib.import_module`, `__import__`) are imports too."""
    out = []
    for node in ast.walk(tree):
        name = _dynamic_import_name(node)
        if name is not None:
            if name.split(".")[0] == PACKAGE:
                out.append((node, name, None, name))
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    out.append((node, alias.name, None, alias.name))
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            if source.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                target = sub if _is_module(sub) else source
                out.append((node, source, alias.name, target))
    return out


def _group(name):
    """`keras_attention.ops.sliding_window` -> "ops"; the root -> None."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


def _where(module, node):
    return f"{module}:{node.lineno}: {ast.unparse(node)}"


def _report(violations):
    return "\n".join(["", *sorted(set(violations))])


def test_every_group_has_a_level():
    groups = {_group(name) for name in MODULES}
    unknown = groups - set(LEVELS) - set(LEAVES)
    assert not unknown, f"Add {sorted(unknown)} to LEVELS or LEAVES."


def _allowed(source_group, target_group):
    if source_group == target_group:
        return True
    if target_group is None or target_group in LEAVES:
        return False  # The root and the leaves import the rest.
    if source_group in LEAVES:
        return target_group in LEAVES[source_group]
    return LEVELS[target_group] <= LEVELS[source_group]


def test_dependency_order_is_one_way():
    violations = [
        _where(module, node)
        for module, tree in MODULES.items()
        for node, _, _, target in _imports(module, tree)
        if not _allowed(_group(module), _group(target))
    ]
    assert not violations, (
        "Imports against utils <- masks <- ops <- layers <- blocks <- "
        f"generation:{_report(violations)}"
    )


def _private_violation(module, source, name, target):
    """Why this import reaches a private name, or None."""
    parts = target.split(".")
    private = [i for i, p in enumerate(parts) if p.startswith("_")]
    if private:
        # A private module: only its own subpackage may import it.
        owner = ".".join(parts[: private[0]])
        # (the subpackage's own __init__ re-exporting it counts as inside).
        if module != owner and not module.startswith(owner + "."):
            return f"private module {target} outside {owner}"
    if name is not None and name.startswith("_") and target == source:
        return f"private name {name} of {source}"
    return None


def test_no_private_names_across_modules():
    violations = []
    for module, tree in MODULES.items():
        for node, source, name, target in _imports(module, tree):
            why = _private_violation(module, source, name, target)
            if why:
                violations.append(f"{_where(module, node)}  ({why})")
    assert not violations, (
        f"Imports of private names from other modules:{_report(violations)}"
    )


def _function_imports(tree):
    """Import statements inside a function (at any depth)."""
    out = []
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(func):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    out.append(node)
                elif _dynamic_import_name(node) is not None:
                    out.append(node)
    return out


def _top_packages(node):
    if isinstance(node, ast.Call):
        return [_dynamic_import_name(node).split(".")[0]]
    if isinstance(node, ast.Import):
        return [alias.name.split(".")[0] for alias in node.names]
    return [(node.module or "").split(".")[0] if not node.level else PACKAGE]


def _lazy_import_allowed(module, node):
    for top in _top_packages(node):
        places = LAZY_IMPORTS.get(top, ())
        if not any(module == p or module.startswith(p + ".") for p in places):
            return False
    return True


def test_no_imports_inside_functions():
    violations = [
        _where(module, node)
        for module, tree in MODULES.items()
        for node in set(_function_imports(tree))
        if not _lazy_import_allowed(module, node)
    ]
    assert not violations, (
        "Imports inside functions (move them to the top of the module, or "
        "backend-specific code to ops/_backend.py or an ops/_backend_<topic>"
        f".py listed in BACKEND_DISPATCH):{_report(violations)}"
    )


def _graph():
    """Module-level imports between the package's modules."""
    graph = {module: set() for module in MODULES}
    for module, tree in MODULES.items():
        for node in tree.body:
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for _, _, _, target in _imports(module, node):
                if target in graph and target != module:
                    graph[module].add(target)
    return graph


def _find_cycle(graph):
    """One import cycle as a list of modules, or None."""
    state = {}

    def visit(module, path):
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return path[path.index(target) :] + [target]
            if target not in state:
                cycle = visit(target, path + [target])
                if cycle:
                    return cycle
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module, [module])
            if cycle:
                return cycle
    return None


def test_dynamic_imports_name_their_module():
    """`importlib.import_module(x)` with a computed `x` hides what it
    imports from every check here."""
    violations = [
        _where(module, node)
        for module, tree in MODULES.items()
        for node in ast.walk(tree)
        if _dynamic_import_name(node) == ""
    ]
    assert not violations, f"Imports by a computed name:{_report(violations)}"


def test_no_import_cycles():
    cycle = _find_cycle(_graph())
    assert cycle is None, "Import cycle: " + " -> ".join(cycle)


def test_no_asserts_in_library_code():
    violations = [
        f"{module}:{node.lineno}: {ast.unparse(node)}"
        for module, tree in MODULES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Assert)
    ]
    assert not violations, (
        f"`assert` in library code (raise ValueError):{_report(violations)}"
    )


# `keras.ops.add` on TensorFlow adds a `(n, 1)`-like operand along the
# wrong axis when the other's axis 1 has size n (keras_attention/ops/
# _backend.py `broadcast_add`); `keras.layers.EinsumDense` adds its bias so.
_BIAS_ADD_HOMES = {
    "keras_attention.ops._backend",
    "keras_attention.layers._einsum_dense",
}


def test_no_keras_add_or_einsum_dense_outside_their_homes():
    def bad(node):
        if not isinstance(node, ast.Call):
            return False
        name = ast.unparse(node.func)
        return name in ("ops.add", "keras.ops.add") or name.endswith(
            "layers.EinsumDense"
        )

    violations = [
        _where(module, node)
        for module, tree in MODULES.items()
        if module not in _BIAS_ADD_HOMES
        for node in ast.walk(tree)
        if bad(node)
    ]
    assert not violations, (
        "keras.ops.add / keras.layers.EinsumDense (use "
        "keras_attention.ops.broadcast_add / layers._einsum_dense):"
        f"{_report(violations)}"
    )


# The checks themselves, on small made-up modules.


def _violations_of(module, source):
    tree = ast.parse(source)
    return {
        "order": [
            target
            for _, _, _, target in _imports(module, tree)
            if not _allowed(_group(module), _group(target))
        ],
        "private": [
            why
            for _, s, n, t in _imports(module, tree)
            if (why := _private_violation(module, s, n, t))
        ],
        "lazy": [
            ast.unparse(node)
            for node in _function_imports(tree)
            if not _lazy_import_allowed(module, node)
        ],
    }


@pytest.mark.parametrize(
    "module, source, kind, expected",
    [
        (
            "keras_attention.ops.attention",
            "from keras_attention.layers import MultiHeadAttention",
            "order",
            ["keras_attention.layers"],
        ),
        (
            "keras_attention.ops.attention",
            "from keras_attention import masks",
            "order",
            [],
        ),
        (
            "keras_attention.masks",
            "from keras_attention.utils import validation",
            "order",
            [],
        ),
        (
            "keras_attention.layers.self_attention",
            "from keras_attention.visualization import plot_attention",
            "order",
            ["keras_attention.visualization.plot_attention"],
        ),
        (
            "keras_attention.layers.self_attention",
            "import keras_attention",
            "order",
            ["keras_attention"],
        ),
        (
            "keras_attention.layers.luong_attention",
            "from keras_attention.layers.bahdanau_attention import _clone",
            "private",
            [
                "private name _clone of "
                "keras_attention.layers.bahdanau_attention"
            ],
        ),
        (
            "keras_attention.ops.blockwise",
            "from keras_attention.ops import _backend",
            "private",
            [],
        ),
        (
            "keras_attention.layers.multi_head_attention",
            "from keras_attention.ops import _backend",
            "private",
            [
                "private module keras_attention.ops._backend outside "
                "keras_attention.ops"
            ],
        ),
        (
            "keras_attention.layers",
            "import importlib\n"
            "importlib.import_module('keras_attention.blocks')",
            "order",
            ["keras_attention.blocks"],
        ),
        (
            "keras_attention.layers",
            "__import__('keras_attention.generation.cache')",
            "order",
            ["keras_attention.generation.cache"],
        ),
        (
            "keras_attention.ops.attention",
            "def f():\n    from keras_attention.ops import blockwise",
            "lazy",
            ["from keras_attention.ops import blockwise"],
        ),
        (
            "keras_attention.layers.attention_rnn_decoder",
            "def f():\n    importlib.import_module('tensorflow')",
            "lazy",
            ["importlib.import_module('tensorflow')"],
        ),
        (
            "keras_attention.layers.attention_rnn_decoder",
            "def f():\n    import tensorflow as tf",
            "lazy",
            ["import tensorflow as tf"],
        ),
        (
            "keras_attention.ops._backend",
            "def f():\n    import tensorflow as tf",
            "lazy",
            [],
        ),
        (
            "keras_attention.ops._backend_flex",
            "def f():\n    import torch",
            "lazy",
            [],
        ),
        (
            "keras_attention.ops._backend_other",
            "def f():\n    import torch",
            "lazy",
            ["import torch"],
        ),
        (
            "keras_attention.visualization.plot_attention",
            "def f():\n    from matplotlib.figure import Figure",
            "lazy",
            [],
        ),
    ],
)
def test_checks_on_examples(module, source, kind, expected):
    assert _violations_of(module, source)[kind] == expected


def test_cycle_finder():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert _find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
