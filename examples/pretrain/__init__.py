"""`python -m examples.pretrain`: three pretraining objectives (masked,
causal and prefix language modelling) on one transformer encoder, compared
by fine-tuning on the `classify` task.

- `__main__.py`: the command line, pretraining, fine-tuning, the table.
- `data.py`: the corpus, the vocabulary, the batches of each objective.
- `model.py`: the backbone, its pretraining heads and the classifier.
"""

__all__ = []
