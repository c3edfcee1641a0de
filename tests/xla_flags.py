"""The XLA flags of the suite's JAX programs, in one place.

The JAX part of `tests/run.sh` and every JAX subprocess a TensorFlow-part
test starts (the language model's quick runs on JAX, the sharded and
multi-process distribution scripts) compile thousands of small programs,
so XLA's compile time dominates them. LLVM's optimization passes are
turned off there: the same operations, compiled faster, run a little
slower (measured on tests/ops/test_score_objects.py under JAX, idle 2-core
machine: 151 s -> 112 s). XLA's newer CPU fusion emitters are turned off
there too: the older ones compile faster (2026-12-03, idle 2-core
machine, the other flags equal: `KERAS_BACKEND=jax pytest -n 2
tests/ops/test_attention_paths.py
tests/blocks/test_transformer_encoder_block.py`, 147 s -> 112 s).
Fast math stays off everywhere (IEEE semantics: `inf`, `nan` and `-inf`
fill values behave as in NumPy).

`tests/conftest.py` sets `XLA_FLAGS` from here unless the environment
already sets it (a developer's own flags win).
"""

import os

IEEE = ("--xla_cpu_enable_fast_math=false",)
FAST_COMPILE = IEEE + (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
    "--xla_cpu_use_fusion_emitters=false",
)


def xla_flags(backend, devices=None):
    """`XLA_FLAGS` for a process on `backend`: JAX compiles fast (see the
    module docstring); TensorFlow's XLA keeps its optimizations (its
    `jit_compile` loops run long enough for the passes to pay off) with
    fast math off. `devices`: that many virtual CPU devices."""
    flags = FAST_COMPILE if backend == "jax" else IEEE
    if devices is not None:
        flags += (f"--xla_force_host_platform_device_count={int(devices)}",)
    return " ".join(flags)


def jax_environment(devices=None, **extra):
    """The environment of a JAX subprocess: this process's, with
    `KERAS_BACKEND=jax`, this module's `XLA_FLAGS` (`devices` virtual CPU
    devices) and `extra` on top."""
    env = dict(os.environ)
    env.update(KERAS_BACKEND="jax", XLA_FLAGS=xla_flags("jax", devices))
    env.update(extra)
    return env
