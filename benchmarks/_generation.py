"""The fresh-process greedy generations of the cache benchmarks
(`mixed_cache.py`, `chunked_cache.py`): each generation runs in a
process of its own, which writes its peak RSS, the bytes of its cache
tensors, its time per token and its tokens; the parent compares the two
caches.

    from _generation import child_generation, run_child, compare_caches

- `child_generation(generator, cache, prompt, max_length, out)` (in the
  child): one `generator.generate(prompt, max_length, cache=cache)`, its
  figures written to `out` (JSON) and its tokens to `out + ".npy"`.
- `run_child(script, cache, max_length, option, directory)` (in the
  parent): runs `script --child cache max_length option out` and returns
  the figures, with the tokens under `"tokens"`.
- `compare_caches(runs, baseline)`: the rows, the ratios `auto / full`
  and the Markdown table of `runs` (`{"auto": figures, "full":
  figures}`) over the peak RSS of a short generation, `baseline` (MiB).
"""

import json
import os
import subprocess
import sys
import time

import numpy as np
from _timing import markdown_table
from _timing import max_rss_mb


def cache_bytes(generator, cache, max_length):
    """Bytes of the cache tensors `generate(cache=...)` keeps."""
    import keras

    from keras_attention.generation import init_cache

    options = dict(generator._cache_options(None, cache))
    caches = init_cache(generator.blocks, 1, max_length, **options)
    tensors = keras.tree.flatten(caches)  # each block's own cache
    return sum(
        int(np.prod(t.shape))
        * np.dtype(keras.backend.standardize_dtype(t.dtype)).itemsize
        for t in tensors
    )


def child_generation(generator, cache, prompt, max_length, out):
    """One greedy generation in this process; writes its figures to
    `out` and its tokens to `out + ".npy"`."""
    start = time.perf_counter()
    tokens, _ = generator.generate(prompt, max_length, cache=cache)
    seconds = time.perf_counter() - start
    np.save(out + ".npy", np.asarray(tokens))
    with open(out, "w") as f:
        json.dump(
            dict(
                seconds=seconds,
                ms_per_token=1e3 * seconds / (max_length - prompt.shape[1]),
                peak_rss_mb=max_rss_mb(),
                cache_mb=cache_bytes(generator, cache, max_length) / 2**20,
            ),
            f,
        )


def run_child(script, cache, max_length, option, directory):
    """`script --child cache max_length option out` in a fresh process:
    its figures, with its tokens under `"tokens"`."""
    out = os.path.join(directory, f"{cache}-{max_length}.json")
    subprocess.run(
        [
            sys.executable,
            os.path.abspath(script),
            "--child",
            cache,
            str(max_length),
            str(option),
            out,
        ],
        check=True,
    )
    with open(out) as f:
        figures = json.load(f)
    figures["tokens"] = np.load(out + ".npy")
    return figures


def compare_caches(runs, baseline):
    """`(rows, ratios, table)` of `runs` (`{"auto": figures, "full":
    figures}`) over the RSS `baseline` (MiB): a row per cache, the ratios
    `auto / full` of the cache tensors, the peak RSS, the peak RSS above
    the baseline and the time per token, the Markdown table of the rows."""
    rows = [
        [
            cache,
            r["cache_mb"],
            r["peak_rss_mb"],
            r["peak_rss_mb"] - baseline,
            r["ms_per_token"],
        ]
        for cache, r in runs.items()
    ]
    full, auto = runs["full"], runs["auto"]
    # NaN where the full run's peak is the baseline's (tiny sizes).
    above = full["peak_rss_mb"] - baseline
    ratios = dict(
        cache=auto["cache_mb"] / full["cache_mb"],
        rss=auto["peak_rss_mb"] / full["peak_rss_mb"],
        rss_above_baseline=(
            (auto["peak_rss_mb"] - baseline) / above if above else float("nan")
        ),
        time=auto["ms_per_token"] / full["ms_per_token"],
    )
    headers = [
        "cache",
        "cache tensors MiB",
        "peak RSS MiB",
        f"above the baseline ({baseline:,.0f} MiB)",
        "ms/token (compile included)",
    ]
    return rows, ratios, markdown_table(headers, rows)
