"""The benchmark scripts' smoke tests: `load_benchmark(name)` imports
`benchmarks/<name>.py` as a module (the scripts are files, not a
package)."""

import importlib.util
import os

import pytest

BENCHMARKS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "benchmarks"
)


@pytest.fixture
def load_benchmark():
    def load(name):
        path = os.path.join(BENCHMARKS, f"{name}.py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
