"""Shared infrastructure of the examples: runtime setup and training
(`training`), tokenizers and batching (`text`), the shipped datasets and
dataset loading (`datasets`)."""

from examples.common.training import HelpFormatter
from examples.common.training import add_training_args
from examples.common.training import fit
from examples.common.training import parse_choices
from examples.common.training import setup_runtime

__all__ = [
    "HelpFormatter",
    "add_training_args",
    "fit",
    "parse_choices",
    "setup_runtime",
]
