"""Torch eager references of the memory-bound ops in generated/transform.py and generated/cache.py.

Same semantics and rounding points as the kernels (fp32 math, one rounding at the output; the
fused residual add rounds z to the input dtype before normalising), written for clarity.  Used
by tests/test_transform.py and tests/test_cache.py, and as the torch eager and torch.compile
baselines of bench/membound.py.
"""

from __future__ import annotations

import torch

__all__ = [
    "rms_norm_ref",
    "fused_add_rms_norm_ref",
    "silu_and_mul_ref",
    "rotary_embedding_ref",
    "reshape_and_cache_ref",
    "reshape_and_cache_nomask_ref",
    "copy_blocks_ref",
    "swap_blocks_ref",
]


def rms_norm_ref(x, weight, eps, residual=None):
    """``(x * rsqrt(mean(x**2, -1) + eps) * weight).to(x.dtype)`` in fp32; with ``residual``,
    ``(rms_norm(z), z)`` with ``z = (x + residual).to(x.dtype)``."""
    if residual is not None:
        return fused_add_rms_norm_ref(x, residual, weight, eps)
    xf = x.float()
    var = xf.pow(2).mean(dim=-1, keepdim=True)
    return (xf * torch.rsqrt(var + eps) * weight.float()).to(x.dtype)


def fused_add_rms_norm_ref(x, residual, weight, eps):
    """vLLM's ``fused_add_rms_norm`` out of place: returns ``(rms_norm(z), z)``."""
    z = (x.float() + residual.float()).to(x.dtype)
    return rms_norm_ref(z, weight, eps), z


def silu_and_mul_ref(x):
    """x [..., 2d] -> ``silu(x[..., :d]) * x[..., d:]`` in fp32, rounded to x.dtype."""
    d = x.shape[-1] // 2
    xf = x.float()
    return (torch.nn.functional.silu(xf[..., :d]) * xf[..., d:]).to(x.dtype)


def rotary_embedding_ref(positions, query, key, cos_sin_cache, head_size, is_neox):
    """In place on query and key (key may be None); only the first rot_dim dims of each head.

    NeoX pairs (i, i + rot_dim / 2), GPT-J pairs (2i, 2i + 1); fp32 math, one rounding.
    """
    rot = cos_sin_cache.shape[1]
    cos, sin = cos_sin_cache.index_select(0, positions.long()).float().chunk(2, dim=-1)
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)

    def apply(x):
        xv = x.unflatten(-1, (-1, head_size)) if x.dim() == 2 else x
        r = xv[..., :rot].float()
        dt = x.dtype
        # Each half is rounded before the halves are joined (the same values as rounding after):
        # torch.compile keeps the joined result in a buffer before writing it back in place (a
        # pair's outputs read both of its inputs), and in x's dtype that buffer is half the bytes.
        if is_neox:
            x1, x2 = r.chunk(2, dim=-1)
            o = torch.cat(((x1 * cos - x2 * sin).to(dt), (x2 * cos + x1 * sin).to(dt)), dim=-1)
        else:
            x1 = r[..., 0::2]
            x2 = r[..., 1::2]
            o = torch.stack(((x1 * cos - x2 * sin).to(dt), (x2 * cos + x1 * sin).to(dt)), dim=-1).flatten(-2)
        xv[..., :rot] = o

    apply(query)
    if key is not None:
        apply(key)
    return query, key


def reshape_and_cache_ref(key, value, key_cache, value_cache, slot_mapping):
    """Token t < len(slot_mapping) goes to cache[slot // block_size, slot % block_size];
    negative slots are skipped."""
    T = slot_mapping.shape[0]
    slots = slot_mapping.long()
    valid = slots >= 0
    s = slots[valid]
    bs = key_cache.shape[1]
    key_cache[s // bs, s % bs] = key[:T][valid]
    value_cache[s // bs, s % bs] = value[:T][valid]


def reshape_and_cache_nomask_ref(key, value, key_cache, value_cache, slot_mapping):
    """reshape_and_cache_ref without the negative-slot mask (no data-dependent shapes), for
    torch.compile; every slot must be valid."""
    T = slot_mapping.shape[0]
    bs = key_cache.shape[1]
    s = slot_mapping.long()
    key_cache[s // bs, s % bs] = key[:T]
    value_cache[s // bs, s % bs] = value[:T]


def copy_blocks_ref(key_caches, value_caches, block_mapping):
    """cache[dst] = cache[src] for every (src, dst) row and every key and value cache."""
    src = block_mapping[:, 0].long()
    dst = block_mapping[:, 1].long()
    for c in list(key_caches) + list(value_caches):
        c[dst.to(c.device)] = c[src.to(c.device)]


def swap_blocks_ref(src, dst, block_mapping):
    """dst[d] = src[s] for every (s, d) row, one block at a time."""
    for s, d in block_mapping.tolist():
        dst[d].copy_(src[s])
