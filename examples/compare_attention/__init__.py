"""`python -m examples.compare_attention`: the attention variants study.

- `__main__.py`: the command line, training and measurements of each
  variant.
- `tasks.py`: the dates of the `translate` example, and the same dates
  hidden in long noisy sentences.
- `models.py`: the variants, built on the `translate` example's models.
- `report.py`: the Markdown tables, the plots and `results.json`.
"""

__all__ = []
