"""SDPA's best case next to the prefill benchmark's baseline: flash attention on contiguous
[batch, heads, seq, dim] tensors, once with the KV heads expanded to every query head (MHA, no
GQA) and once as bench/attention.py calls it (views of [tokens, heads, dim] data, enable_gqa).
Equal batches of 16k tokens, causal, bf16, GPU time (bench/timing.gpu_ms).  Prints a table and
writes $OUT/sdpa_anchor.json.  How far the second is from the first says how much of the prefill
ratios comes from SDPA's GQA and layout handling rather than from our kernel."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import gpu_ms  # noqa: E402

from generated import attention as at  # noqa: E402

TOKENS = 16384
rows = []
for head_dim, (H, Hkv) in {128: (32, 8), 256: (16, 4)}.items():
    for seq in (4096, 16384):
        B = TOKENS // seq
        q = torch.randn(B * seq, H, head_dim, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B * seq, Hkv, head_dim, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        flops = 4 * seq * seq * head_dim * H * B / 2
        views = [t.view(B, seq, t.shape[1], head_dim).transpose(1, 2) for t in (q, k, v)]
        mha = [views[0].contiguous()] + [t.repeat_interleave(H // Hkv, dim=1).contiguous() for t in views[1:]]
        cu = torch.arange(0, B * seq + 1, seq, device="cuda", dtype=torch.int32)
        out = torch.empty_like(q)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            t_mha = gpu_ms(lambda: F.scaled_dot_product_attention(*mha, is_causal=True))
            t_gqa = gpu_ms(lambda: F.scaled_dot_product_attention(*views, is_causal=True, enable_gqa=True))
        t_ours = gpu_ms(lambda: at.prefill_attention(q, k, v, cu, cu, seq, seq, causal=True, out=out))
        row = {
            "head_dim": head_dim,
            "seq": seq,
            "batch": B,
            "sdpa_mha_contiguous_tflops": flops / t_mha / 1e9,
            "sdpa_gqa_views_tflops": flops / t_gqa / 1e9,
            "ours_tflops": flops / t_ours / 1e9,
        }
        rows.append(row)
        print(
            f"d={head_dim} seq={seq} B={B}: SDPA flash MHA contiguous {row['sdpa_mha_contiguous_tflops']:.1f} TF/s, "
            f"SDPA enable_gqa on views {row['sdpa_gqa_views_tflops']:.1f}, ours {row['ours_tflops']:.1f} "
            f"(ours / MHA {row['ours_tflops'] / row['sdpa_mha_contiguous_tflops']:.3f})",
            flush=True,
        )
if os.environ.get("OUT"):
    Path(os.environ["OUT"], "sdpa_anchor.json").write_text(json.dumps(rows, indent=1))
