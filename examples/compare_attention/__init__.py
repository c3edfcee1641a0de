"""`python -m examples.compare_attention`: the attention variants study.

- `__main__.py`: the command line, training with early stopping and
  measurements of each variant.
- `options.py`: the names of the variants and tasks (no imports: the
  command line checks them before Keras is imported).
- `tasks.py`: the dates of the `translate` example, the same dates
  hidden in long noisy sentences, and the length-generalisation split.
- `models.py`: the variants, built on the `translate` example's models.
- `report.py`: the Markdown tables, the plots and `results.json`.
"""

__all__ = []
