"""FlexAttention's backend side (PyTorch, for `ops/flex.py`): the
compiled kernel, the block masks built for it and kept, whether it can
run here.

Part of the package's backend dispatch (with `_backend.py`, the only
modules that import TensorFlow, JAX or PyTorch, lazily, inside the
function that needs it). State: the compiled function (its kernels cached
per shape by `torch.compile`), recent block masks, a compilation that
failed.
"""

import sys
import warnings

import keras

_FLEX = {"kernel": None, "failure": None}
_FLEX_BLOCK_MASKS = {}
FLEX_BLOCK_MASK_CACHE = 32  # Block masks kept (least recently used out)
# Kernels kept (`torch.compile`'s default, 8, runs slow eager code after).
FLEX_RECOMPILE_LIMIT = 128
FLEX_BLOCK = 128  # The blocks of a block mask (queries x keys).
# On a CPU, an arithmetic mask (bands, documents) takes blocks of this
# size instead when they visit at most `FLEX_SMALL_BLOCK_WORK` of the
# entries `FLEX_BLOCK`'s visit: the CPU kernel computes its blocks whole
# (a block is its tile), so smaller blocks waste less on a mask's edges,
# at a cost per entry. Measured (torch 2.13, AMD EPYC 2 cores, idle,
# `flex_attention` called directly, 64 vs 128 blocks): time ratio 0.83
# for 8 causal documents at T = 2,048 (entries 0.83), 0.91 for a causal
# window of 512 (0.90), 1.05 for a causal mask (0.97), 0.96 for the
# documents at 8,192 (0.94): a 64-block entry costs up to ~1.08x a
# 128-block one (`benchmarks/programmable_attention.py --tables flex`:
# the rows "flex_attention, blocks of 64").
# CUDA keeps `FLEX_BLOCK` (its kernels' tiles are not the blocks).
FLEX_SMALL_BLOCK = 64
FLEX_SMALL_BLOCK_WORK = 0.92


def flex_unavailable():
    """None when PyTorch can compile FlexAttention kernels here, else why
    (another backend, an old torch, no C++ compiler or AVX2 for the CPU
    kernels, an earlier compilation that failed)."""
    backend = keras.backend.backend()
    if backend != "torch":
        return (
            "FlexAttention is PyTorch's kernel and the Keras backend is "
            f"{backend!r}"
        )
    if _FLEX["failure"] is not None:
        return _FLEX["failure"]
    if "here" not in _FLEX:  # Asked once (a compiler search: ~1 ms).
        _FLEX["here"] = _flex_here_unavailable()
    return _FLEX["here"]


def _flex_here_unavailable():
    """Why this torch cannot compile FlexAttention kernels here, else
    None."""
    import torch

    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return (
            f"torch {torch.__version__} has no FlexAttention "
            "(`torch.nn.attention.flex_attention`, torch >= 2.5)"
        )
    if torch.cuda.is_available():
        return None
    return _flex_cpu_unavailable()


def _flex_cpu_unavailable():
    try:
        from torch._inductor import cpp_builder
        from torch._inductor.kernel.flex import flex_cpu

        cpp_builder.get_cpp_compiler()
    except Exception as error:  # noqa: BLE001 - no compiler, or no inductor.
        return (
            "torch.compile cannot build FlexAttention's CPU kernels here "
            f"(no C++ compiler: {type(error).__name__}: {error})"
        )
    if not flex_cpu.check_cpu_supported():
        return "FlexAttention's CPU kernels need an x86 CPU with AVX2"
    return None


def flex_on_gpu(x):
    """`(x on CUDA, torch's version)`: FlexAttention's backward pass and
    log-sum-exp are CUDA's only."""
    import torch

    device = getattr(x, "device", None)  # NumPy's: "cpu".
    return getattr(device, "type", device) == "cuda", torch.__version__


def flex_grad_enabled():
    """Whether PyTorch records operations for a gradient (grad mode)."""
    import torch

    return torch.is_grad_enabled()


def flex_needs_gradient(tensors, reads_other=False):
    """Whether a call needs a gradient: grad mode, and one of `tensors`
    (variables too) requires grad, or `reads_other`."""
    if not flex_grad_enabled():
        return False
    if reads_other:
        return True
    for x in tensors:
        x = getattr(x, "value", x)  # A Keras variable: its parameter.
        if getattr(x, "requires_grad", False):
            return True
    return False


def flex_block_mask(evaluate, key, shape, like, chunk=None, mask_mod=None):
    """`(BlockMask, density)` of a mask `(q_len, kv_len) = shape`, built
    once per `key` (what the mask depends on) and device (`like`'s).
    `mask_mod()`: the kernel's mask function on its partial blocks when
    the mask is arithmetic on the indices (bands, documents: faster than a
    table, and no table is built), else None: the table below (asked for
    only when the block mask is built).

    `evaluate(q_start, q_stop)` gives the mask of those query rows, bool
    `(b|1, h|1, rows, kv_len)`, `chunk` rows at a time (about 2**22
    entries). Without `mask_mod` the mask is not traced into the kernel:
    its full blocks need none, empty ones are skipped, the others' entries
    are a table (`(n, block, block)`, `n` a power of two: few kernels)
    the kernel's `mask_mod` looks up: one kernel serves every such mask
    (inductor's CPU kernels computed some gathers in a `mask_mod` wrongly
    in torch 2.13: `index_select`, Keras's `ops.take`). `density`: the
    share of blocks visited."""
    key = (key, tuple(shape), str(like.device))
    cached = _FLEX_BLOCK_MASKS.pop(key, None)
    if cached is None:
        kernel_mask = None if mask_mod is None else mask_mod()
        cached = _build_block_mask(
            evaluate, shape, like.device, chunk, kernel_mask
        )
    _FLEX_BLOCK_MASKS[key] = cached
    while len(_FLEX_BLOCK_MASKS) > FLEX_BLOCK_MASK_CACHE:
        _FLEX_BLOCK_MASKS.pop(next(iter(_FLEX_BLOCK_MASKS)))
    return cached


def _build_block_mask(evaluate, shape, device, chunk, kernel_mask=None):
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    (q_len, kv_len), block = shape, FLEX_BLOCK
    nk = -(-kv_len // block)
    rows = chunk or max(block, (2**22 // (nk * block)) // block * block)
    # An arithmetic mask on a CPU may take smaller blocks (`_block_size`):
    # its blocks' kinds are counted in those, then in `block`'s.
    small = kernel_mask is not None and torch.device(device).type == "cpu"
    step = FLEX_SMALL_BLOCK if small else block
    # Table blocks: 0 masks all, 1 none, then the partial ones (eager
    # FlexAttention reads `mask_mod` on every block). None with an
    # arithmetic `kernel_mask`: the blocks' kinds only.
    seen, full, table, slots, count = [], [], [], [], 2
    for start in range(0, q_len, rows):
        m = torch.as_tensor(evaluate(start, min(start + rows, q_len)))
        m = m.to(device=device, dtype=torch.bool)
        n = m.shape[2]
        pad = (0, nk * block - kv_len, 0, -(-n // block) * block - n)
        m = torch.nn.functional.pad(m, pad, value=False)
        # (b|1, h|1, rows / step, nk * block / step, step, step)
        m = m.unflatten(3, (-1, step)).unflatten(2, (-1, step))
        m = m.transpose(3, 4)
        seen.append(m.any(dim=(4, 5)))
        full.append(m.all(dim=(4, 5)))
        if kernel_mask is not None:
            continue
        partial = seen[-1] & ~full[-1]
        table.append(m[partial])  # The partial blocks' entries, in order.
        slot = torch.cumsum(partial.flatten(), 0).view(partial.shape)
        slot = torch.where(partial, slot + (count - 1), full[-1].long())
        slots.append(slot)
        count += table[-1].shape[0]
    seen, full = torch.cat(seen, dim=2), torch.cat(full, dim=2)
    if small:
        block, seen, full = _block_size(seen, full, shape)
    partial = seen & ~full
    density = float(seen.float().mean())
    if kernel_mask is None:
        kernel_mask = _table_mask(table, slots, count, seen.shape, device)

    def ordered(blocks):
        counts = blocks.sum(-1, dtype=torch.int32)
        order = torch.argsort(
            blocks.to(torch.int8), dim=-1, descending=True, stable=True
        )
        return counts, order.to(torch.int32).contiguous()

    block_mask = BlockMask.from_kv_blocks(
        *ordered(partial),
        *ordered(full),
        BLOCK_SIZE=block,
        mask_mod=kernel_mask,
        seq_lengths=shape,
    )
    return block_mask, density


def _block_size(seen, full, shape):
    """`(block, seen, full)`: the blocks the kernel takes, `FLEX_BLOCK`
    or `FLEX_SMALL_BLOCK` (fewer entries visited: at most
    `FLEX_SMALL_BLOCK_WORK` of the others'), and their kinds, from the
    kinds of the small ones (`(b|1, h|1, q blocks, kv blocks)`, padded to
    whole large blocks)."""
    small, large = FLEX_SMALL_BLOCK, FLEX_BLOCK
    ratio = large // small
    # A large block: `ratio` x `ratio` small ones.
    grid = (-1, ratio)
    seen_l = seen.unflatten(3, grid).unflatten(2, grid).any(dim=(3, 5))
    full_l = full.unflatten(3, grid).unflatten(2, grid).all(dim=(3, 5))
    work_small = int(seen.sum()) * small * small
    work_large = int(seen_l.sum()) * large * large
    if work_small > FLEX_SMALL_BLOCK_WORK * work_large:
        return large, seen_l, full_l
    q_blocks, kv_blocks = (-(-n // small) for n in shape)
    seen, full = (x[..., :q_blocks, :kv_blocks] for x in (seen, full))
    return small, seen, full


def _table_mask(table, slots, count, shape, device):
    """The `mask_mod` that looks each entry up in the partial blocks'
    `table` (`slots`: each block's entry in it; 0 masks all, 1 none)."""
    import torch

    block = FLEX_BLOCK
    size = 1 << (count - 1).bit_length()  # A power of two >= count.
    ends = torch.zeros((2, block, block), dtype=torch.bool, device=device)
    ends[1] = True
    padding = torch.zeros((size - count, block, block), dtype=torch.bool)
    table = torch.cat([ends] + table + [padding.to(device)], dim=0)
    slots = torch.cat(slots, dim=2).to(torch.int32)
    bb, hh = int(shape[0] > 1), int(shape[1] > 1)

    def table_mask(batch, head, q_idx, kv_idx):
        slot = slots[batch * bb, head * hh, q_idx // block, kv_idx // block]
        return table[slot, q_idx % block, kv_idx % block]

    return table_mask


def _flex_kernel(q, k, v, score_mod, block_mask, scale, gqa, lse):
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(
        q, k, v, score_mod, block_mask, scale, enable_gqa=gqa, return_lse=lse
    )


class FlexCompileError(RuntimeError):
    """`torch.compile` could not compile a FlexAttention kernel (the
    message says why); the caller runs another path."""


def flex_attention(
    query, key, value, score_fn, block_mask, scale, lse, copies=(True,) * 3
):
    """FlexAttention on `(b, T, h, d)` tensors (`g` key/value heads
    divide `h`): the output `(b, i, h, e)`, and with `lse` its
    log-sum-exp `(b, h, i)`. One `torch.compile` (static shapes): a
    kernel per shape, dtype and score function, compiled at its first
    call and reused after; `FlexCompileError` when compiling fails.

    `copies`: for the query, key and value, whether the kernel gets a
    contiguous `(b, h, T, d)` copy, else the view (rows `h * d` apart).
    The output is laid out as the query the kernel gets (the view: our
    layout; a copy: a transposed view of the kernel's `(b, h, i, e)`);
    which copies pay: `flex.kernel_copies`."""
    import torch
    import torch._dynamo

    query, key, value = (
        _heads_first(x, copy) for x, copy in zip((query, key, value), copies)
    )
    if _FLEX["kernel"] is None:
        # Our own function: kernels apart from the program's other ones.
        _FLEX["kernel"] = torch.compile(_flex_kernel, dynamic=False)
    gqa = query.shape[1] != key.shape[1]
    args = (query, key, value, score_fn, block_mask, scale, gqa, lse)
    # Set and restored by hand (`config.patch` costs ~2x as much a call),
    # where it is lower.
    config = torch._dynamo.config
    limit = config.recompile_limit
    if limit < FLEX_RECOMPILE_LIMIT:
        config.recompile_limit = FLEX_RECOMPILE_LIMIT
    try:
        with warnings.catch_warnings():
            # Dynamo's notes on what it steps around while tracing a
            # score function (Keras's builtins and caches) are not ours.
            warnings.filterwarnings("ignore", "Dynamo does not know how")
            warnings.filterwarnings("ignore", "Dynamo detected a call to")
            result = _FLEX["kernel"](*args)
    except torch._dynamo.exc.TorchDynamoException as error:
        reason = str(error).strip().splitlines()[0][:300]
        reason = f"torch.compile failed ({type(error).__name__}: {reason})"
        if isinstance(error, torch._dynamo.exc.BackendCompilerFailed):
            _FLEX["failure"] = reason  # The toolchain: not again.
        raise FlexCompileError(reason) from error
    finally:
        if limit < FLEX_RECOMPILE_LIMIT:
            config.recompile_limit = limit
    if lse:
        return result[0].transpose(1, 2), result[1]
    return result.transpose(1, 2)


def _heads_first(x, copy):
    """`(b, T, h, d)` -> a `(b, h, T, d)` torch tensor, contiguous with
    `copy`."""
    import torch

    if not isinstance(x, torch.Tensor):  # NumPy, lists: Keras's device.
        x = keras.ops.convert_to_tensor(x)
    x = x.transpose(1, 2)
    return x.contiguous() if copy else x


def host_array(x):
    """The NumPy array of a CPU torch tensor's values (shared, no copy),
    else None (`flex.tensor_digest`: no Keras conversion per call)."""
    torch = sys.modules.get("torch")  # Not imported: not a torch tensor.
    if torch is None or not isinstance(x, torch.Tensor):
        return None
    if x.device.type != "cpu":
        return None
    try:
        return x.detach().numpy()
    except (TypeError, RuntimeError):  # bfloat16, a conjugate's view.
        return None


def relative_bias_sdpa(query, key, value, table, scale):
    """SDPA on `(b, h, T, d)` tensors (`g` key/value heads divide `h`)
    with the bias `table[h, i + j']` of the keys in reverse order `j' =
    T_k - 1 - j` (`table`: float32 `(h|1, T_q + T_k - 1)`, `-inf` where
    masked): a strided view of the table, no `(h, T_q, T_k)` bias formed
    (`relative_sdpa.py`)."""
    import torch
    import torch.nn.functional as F

    tq, tk = query.shape[2], key.shape[2]
    table = table.contiguous()
    bias = table.as_strided(
        (1, table.shape[0], tq, tk), (0, table.stride(0), 1, 1)
    )
    return F.scaled_dot_product_attention(
        query,
        torch.flip(key, (2,)),
        torch.flip(value, (2,)),
        attn_mask=bias,
        scale=float(scale),
        enable_gqa=query.shape[1] != key.shape[1],
    )
