"""DeepSeek-V3.2's indexer in `hf_reference.py` (the torch process only):
weights with clear gaps between the index scores, and the smallest gap
that decided a top-k choice, recorded.

A lightning indexer with few heads gives exact ties (ReLU zeros) and
near ties, and a top-k choice among them depends on rounding and on how
each implementation breaks ties (issue 56's trap: torch's CPU `topk`
does not keep the lowest index first). `sharpen` removes the ReLU zeros
(every query-key product positive), and
`record_gaps` notes, for every top-k choice the indexers make (forward
and generation), the gap between the k-th and the (k+1)-th selectable
score: the tests require it to be clear."""

import torch


def indexers(model):
    """The model's `DeepseekV32Indexer`s."""
    return [m for m in model.modules() if type(m).__name__.endswith("Indexer")]


def sharpen(model):
    """Index scores without ReLU zeros (ties) and spread out: every
    query of every head has `q . k > 0` with every key, so that the
    scores are a generic linear function of the keys.

    The query latent's first feature is made the same sign for every
    token (`q_a_proj`'s bias 5 there, its weights there small: after
    the latent's RMS norm it is about 2, whatever the token; the other
    features still vary), the indexer's queries read it with a large
    positive weight on their unrotated features, and its keys' unrotated
    features get a positive offset (`k_norm`'s bias + 4)."""
    with torch.no_grad():
        for attention in model.modules():
            ix = getattr(attention, "indexer", None)
            if ix is None or type(ix).__name__ != "DeepseekV32Indexer":
                continue
            if attention.q_a_proj.bias is None:
                raise ValueError("sharpen needs attention_bias=True")
            attention.q_a_proj.weight[0] *= 0.05
            attention.q_a_proj.bias[0] = 5.0
            p = ix.qk_rope_head_dim
            ix.wq_b.weight.view(ix.n_heads, ix.head_dim, -1)[:, p:, 0] += 3.0
            ix.k_norm.bias[p:] += 4.0


def _smallest_gap(scores, k):
    """The smallest gap between the k-th and (k+1)-th selectable scores
    (finite, above -1e30: transformers adds the mask's float minimum) of
    the rows of `scores` `(..., keys)` with more than k of them."""
    scores = scores.detach().float()
    values = torch.sort(scores, dim=-1, descending=True).values
    selectable = (scores > -1e30).sum(-1)
    if values.shape[-1] <= k:
        return float("inf")
    gaps = values[..., k - 1] - values[..., k]
    gaps = gaps[selectable > k]
    return float(gaps.min()) if gaps.numel() else float("inf")


def record_gaps(model):
    """A list that fills, as the model runs, with the smallest gap of each
    top-k choice of its indexers (none: no indexer)."""
    gaps = []
    for ix in indexers(model):
        ix.forward = _recording(ix.forward, ix.index_topk, gaps)
    return gaps


def _recording(forward, k, gaps):
    def run(*args, **kwargs):
        topk = torch.Tensor.topk

        def record(self, *a, **kw):
            gaps.append(_smallest_gap(self, k))
            return topk(self, *a, **kw)

        torch.Tensor.topk = record
        try:
            return forward(*args, **kwargs)
        finally:
            torch.Tensor.topk = topk

    return run
