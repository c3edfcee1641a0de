"""An autouse fixture that runs a test module with one PyTorch intra-op
thread, for modules of many tiny eager calls (the mask matrix, the
generation tests' eager `fit`). Import it into the module:

    from one_torch_thread import one_torch_thread  # noqa: F401

Why: the suite runs two pytest workers on two cores, and PyTorch starts as
many OpenMP threads as cores in each. A tiny op that PyTorch parallelizes
(softmax, scaled_dot_product_attention) then waits for a thread the other
worker holds: measured on the loaded 2-core machine, softmax of a
(2, 2, 5, 6) tensor took ~44 ms with 2 threads and ~10 us with 1, and the
encoder-decoder test's training fixture ~220 CPU s instead of ~13 (the
examples' subprocesses set OMP_NUM_THREADS=1 for the same reason). The
tensors here are far too small to gain from threads. The previous count
is restored after the module. A no-op on the other backends.
"""

import keras
import pytest


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    if keras.backend.backend() != "torch":
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
