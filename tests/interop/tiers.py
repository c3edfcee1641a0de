"""The CI tiers of the converted families (issue 55): each family runs
once on TensorFlow in the fast tier (hidden states and greedy tokens);
JAX and PyTorch run the same tests in the slow tier (`SLOW=1`), as do the
`.keras` reloads of a family whose options another family's reload
already covers. A test module puts `pytestmark = family_tier()` at its
top; a reload that another family's covers takes `reload_tier(...)`."""

import keras
import pytest

FAST_BACKEND = "tensorflow"


def family_tier():
    """The marks of a converted family's test module: none on
    TensorFlow, the slow tier on the other backends."""
    if keras.backend.backend() == FAST_BACKEND:
        return []
    return [
        pytest.mark.slow(
            reason="converted families run in the fast tier on TensorFlow "
            "(tests/interop/tiers.py); JAX and PyTorch in the slow tier"
        )
    ]


def reload_tier(covered_by):
    """The mark of a `.keras` reload test whose layers and options the
    reload of family `covered_by` already checks in the fast tier."""
    return pytest.mark.slow(
        reason=f"its layers' reload is covered by {covered_by}'s "
        "(tests/interop/tiers.py)"
    )
