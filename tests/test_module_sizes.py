"""The library stays in pieces small enough to read (issue 37): no module
of `keras_attention/` over `MAX_FILE_LINES` lines (`wc -l`), and no
function or method over `MAX_FUNCTION_LINES` lines of code, counted from
its `def` (decorators included) to its last line, without its docstring
(documentation is not what makes a function hard to follow; a docstring
of argument tables and examples stays whole).

A file or function that outgrows them is split along its seams (see
CONTRIBUTING.md), not added to an exception list: there is none.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "keras_attention"
MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 120
FILES = sorted(ROOT.rglob("*.py"))


def _docstring_lines(node):
    body = node.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        return body[0].end_lineno - body[0].lineno + 1
    return 0


def function_sizes(source):
    """`(name, first line, lines of code without the docstring)` of every
    function and method in `source`."""
    sizes = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            lines = node.end_lineno - first + 1 - _docstring_lines(node)
            sizes.append((node.name, node.lineno, lines))
    return sizes


def test_there_are_files():
    assert len(FILES) > 50


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_small(path):
    source = path.read_text()
    lines = source.count("\n") + (not source.endswith("\n") and bool(source))
    assert lines <= MAX_FILE_LINES, (
        f"{path.relative_to(ROOT.parent)} has {lines} lines (at most "
        f"{MAX_FILE_LINES}): split it along its seams"
    )
    long = [
        f"{name} (line {line}): {size} lines"
        for name, line, size in function_sizes(source)
        if size > MAX_FUNCTION_LINES
    ]
    assert not long, (
        f"functions of {path.relative_to(ROOT.parent)} over "
        f"{MAX_FUNCTION_LINES} lines of code: {long}"
    )


def test_the_counts_are_those_of_wc_and_of_the_code():
    source = (
        '@decorator\ndef f(x):\n    """Doc\n\n    more doc.\n    """\n'
        "    y = x\n    return y\n"
    )
    assert function_sizes(source) == [("f", 2, 4)]
