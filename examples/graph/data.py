"""The graph of the `graph` example: node features from the synsets'
text, the undirected edge list, the labelled split and small subgraphs.

Everything here is NumPy (and scikit-learn for the text features), and
deterministic for a given seed.
"""

import numpy as np


def text_features(texts, dim=256, seed=0):
    """`(N, dim)` float32 features of N texts: TF-IDF of their words
    (sublinear term frequency, English stop words left out, words of at
    least 2 texts) reduced to `dim` dimensions by a truncated SVD (latent
    semantic analysis), each column then standardized.

    Unsupervised and computed on every node's text, as the bag-of-words
    features of Cora and Citeseer are (the transductive setting).
    """
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer

    tfidf = TfidfVectorizer(
        min_df=2, sublinear_tf=True, stop_words="english", dtype=np.float32
    ).fit_transform(texts)
    dim = max(1, min(dim, tfidf.shape[1] - 1, len(texts) - 1))
    svd = TruncatedSVD(dim, algorithm="randomized", random_state=seed)
    x = svd.fit_transform(tfidf).astype("float64")
    x = (x - x.mean(0)) / (x.std(0) + 1e-8)
    return x.astype("float32")


def undirected_edges(senders, receivers):
    """Both directions of every edge, each pair once, without
    self-loops: `(senders, receivers)` int32, sorted by receiver."""
    senders = np.asarray(senders, "int64")
    receivers = np.asarray(receivers, "int64")
    n = int(max(senders.max(initial=-1), receivers.max(initial=-1))) + 1
    s = np.concatenate([senders, receivers])
    r = np.concatenate([receivers, senders])
    keep = s != r
    keys = np.unique(r[keep] * n + s[keep])
    return (keys % n).astype("int32"), (keys // n).astype("int32")


def split_nodes(labels, per_class, num_validation, num_test, seed):
    """The Planetoid split (Yang et al., 2016; Kipf and Welling, 2017):
    `per_class` random labelled training nodes of each class (at most
    half of a class's nodes), then `num_validation` random validation
    nodes and `num_test` test nodes among the others (None: all the
    others). Returns `(train, validation, test)` sorted int arrays."""
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels)
    train = []
    for c in np.unique(labels):
        nodes = np.flatnonzero(labels == c)
        take = min(per_class, len(nodes) // 2)
        train.extend(rng.choice(nodes, take, replace=False))
    train = np.sort(np.array(train, "int64"))
    rest = rng.permutation(np.setdiff1d(np.arange(len(labels)), train))
    validation = np.sort(rest[:num_validation])
    end = None if num_test is None else num_validation + num_test
    test = np.sort(rest[num_validation:end])
    return train, validation, test


def _neighbours(num_nodes, senders, receivers):
    """CSR of the senders of each receiver: `(starts, senders)`."""
    order = np.argsort(receivers, kind="stable")
    counts = np.bincount(receivers, minlength=num_nodes)
    starts = np.concatenate([[0], np.cumsum(counts)])
    return starts, np.asarray(senders)[order]


def neighbours_of(node, senders, receivers):
    """The senders of the edges into `node`."""
    return np.asarray(senders)[np.asarray(receivers) == node]


def bfs_nodes(num_nodes, senders, receivers, size, starts=10, seed=0):
    """About `size` nodes reached by breadth-first search from `starts`
    random nodes (`size // starts` from each, fewer when a component is
    exhausted), as a sorted int array: a connected-ish sample of a graph
    whose induced subgraph keeps most of its nodes' edges, unlike a
    random sample of the nodes."""
    rng = np.random.default_rng(seed)
    begin, adjacent = _neighbours(num_nodes, senders, receivers)
    seen = np.zeros(num_nodes, bool)
    chosen = []
    quota = max(1, size // starts)
    while len(chosen) < size:
        root = int(rng.integers(num_nodes))
        if seen[root]:
            continue
        seen[root] = True
        queue, taken = [root], 0
        while queue and taken < quota and len(chosen) < size:
            node = queue.pop(0)
            chosen.append(node)
            taken += 1
            for other in adjacent[begin[node] : begin[node + 1]]:
                if not seen[other]:
                    seen[other] = True
                    queue.append(int(other))
        for node in queue:  # reached but not taken
            seen[node] = False
    return np.sort(np.array(chosen, "int64"))


def induced_subgraph(nodes, senders, receivers):
    """The edges among `nodes` (sorted ids), renumbered `0 .. len-1`:
    `(senders, receivers)` int32."""
    nodes = np.asarray(nodes)
    senders, receivers = np.asarray(senders), np.asarray(receivers)
    keep = np.isin(senders, nodes) & np.isin(receivers, nodes)
    return (
        np.searchsorted(nodes, senders[keep]).astype("int32"),
        np.searchsorted(nodes, receivers[keep]).astype("int32"),
    )
