"""`python -m examples.graph`: semi-supervised node classification with
graph attention on the WordNet noun graph.

- `__main__.py`: the command line, training of the four models over the
  seeds, the table, the attention plot and explorer.
- `data.py`: text features, undirected edges, the Planetoid split,
  subgraphs.
- `model.py`: the MLP, mean-aggregation, GAT and GATv2 node classifiers.
- `plots.py`: the attention of a few nodes over their neighbours (PNG).
"""

__all__ = []
