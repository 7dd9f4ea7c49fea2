"""generated/attention.py's warm-up driver (hand-written; policy_runtime/warmup/ runs it).

Calls covered, in the dtypes asked: prefill (int32 cu_seqlens, causal and not) and paged decode
(int32 block tables and lengths, cache blocks of ``block_size`` tokens) for each model whose
head_dim the kernels serve, with the model's query and KV heads; decode so that both the decode
kernel and the V2 merge compile. Each in every attention feature set the model's layers use (its
AttentionFeatures record on the target: ``softcap``, ``alibi`` and ``sinks`` on every layer,
``sliding_window`` on its local layers, so a windowed model warms its windowed and its unwindowed
kernels; fp32 slopes and sinks), as ``attention_feature_sets`` lists them; other feature sets
compile on first use. On targets with e4m3fn, also decode over an fp8 KV cache (float32 tensor
scales; its own tiles) and the causal paged prefill over it. A registered vendor decode kernel and
the PyTorch path of long sequences compile nothing.
"""

from __future__ import annotations

from typing import Any

import torch

from ..warmup.calls import Call, Options, empty, torch_dtype

__all__ = ["AttentionDriver", "attention_feature_sets"]

def attention_feature_sets(dims: dict) -> list[tuple[str, dict]]:
    """The attention feature sets a model's layers call with, from its MODEL_DIMS entry: (label,
    keyword arguments of prefill_attention / decode_attention, less the tensors' values).  Its
    soft-cap, ALiBi and sinks apply to every layer; a sliding window to its local layers only (Gemma 2,
    gpt-oss alternate local and global layers), so a model with a window has two sets."""
    common: dict = {}
    if dims.get("logit_softcap"):
        common["softcap"] = float(dims["logit_softcap"])
    if dims.get("alibi"):
        common["alibi"] = True
    if dims.get("attention_sinks"):
        common["sinks"] = True
    label = "+".join(sorted(common)) or "plain"
    sets = [(label, common)]
    if dims.get("sliding_window"):
        sets.append((f"window{dims['sliding_window']}" + "".join(f"+{k}" for k in sorted(common)),
                     {**common, "window": int(dims["sliding_window"])}))  # fmt: skip
    return sets


def _attention_kwargs(items: tuple, heads: int, device: torch.device) -> dict:
    # A call's feature set (its sorted items, hashable) as keyword arguments with tensors.
    feat, out = dict(items), {}
    if "window" in feat:
        out["window_size"] = (feat["window"] - 1, 0)  # a model's sliding_window W: flash-attn's (W - 1, 0)
    if "softcap" in feat:
        out["softcap"] = feat["softcap"]
    if feat.get("alibi"):
        out["alibi_slopes"] = empty((heads,), torch.float32, device)
    if feat.get("sinks"):
        out["sinks"] = empty((heads,), torch.float32, device)
    return out


class AttentionDriver:
    """generated/attention.py's calls: prefill (causal and not) and paged decode (the decode
    kernel and the V2 merge) per model whose head_dim the kernels serve, dtype and feature set
    the model's layers use (``attention_feature_sets``: each compiles its own specialization)."""

    def __init__(self, module: str, att: Any) -> None:
        self.module, self.att = module, att

    def calls(self, opts: Options) -> tuple[list[Call], list[str]]:
        calls, notes = [], []
        other = opts.pick == "other"
        for model, dims in opts.models.items():
            hd, nq, nk = dims.get("head_dim"), dims.get("num_heads"), dims.get("num_kv_heads")
            if not (hd and nq and nk):
                continue
            if self.att.tile_of(hd) is None:
                notes.append(f"attention {model}: head_dim {hd} is not served ({self.att.served()})")
                continue
            # The model's AttentionFeatures record on the target (its MODEL_DIMS entry where the
            # tables have none): exactly the specializations the model's layers launch.
            rec = self.att.features.get(model, {}).get(opts.target)
            if rec is not None:
                dims = {"sliding_window": rec.sliding_window, "logit_softcap": rec.softcap, "alibi": rec.alibi,
                        "attention_sinks": rec.sinks}  # fmt: skip
            for dtype in opts.dtypes:
                tokens = 37 if other else 16
                for label, feat in attention_feature_sets(dims):
                    # The records a call of this set selects (its keys are Features.uses' names).
                    sel = self.att.select(torch_dtype(dtype), hd, opts.target, uses=frozenset(feat))
                    for causal in (True, False):
                        what = ("prefill", model, dtype, "causal" if causal else "full", sel.prefill.name, label)
                        args = (opts.target, dtype, tokens, nq, nk, hd, causal, tuple(sorted(feat.items())))
                        calls.append(Call(self.module, "prefill", args, what, 3))
                    # A context past v1_v2_threshold (and not past the PyTorch path's threshold, where
                    # the lengths would go to the host): the decode kernel and the merge, one launch
                    # each.  A windowed call's decode kernel is its own specialization and the merge
                    # is the same kernel as the model's other set's: a context of at most one
                    # partition (V1 at any batch) compiles it alone.
                    cfg, bs = sel.config, opts.block_size
                    limit = cfg.v1_v2_threshold + 1
                    if limit > cfg.pytorch_decode_threshold:
                        limit = cfg.v1_v2_threshold  # no V2 on this target: the decode kernel alone
                    if "window" in feat:
                        limit = min(feat["window"], cfg.partition_size)
                    blocks = -(-limit // bs)
                    seqs = 3 if other else 1
                    what = ("decode", model, dtype, f"{blocks * bs} tokens", sel.decode.name, label)
                    args = (opts.target, dtype, seqs, nq, nk, hd, bs, blocks, tuple(sorted(feat.items())))
                    calls.append(Call(self.module, "decode", args, what, 3))
                    if opts.target not in self.att.fp8_unserved:
                        # Over an fp8 (e4m3fn) KV cache: its own decode tiles (the length as above:
                        # its V2 partitions are no longer than the 16-bit ones) and the paged
                        # causal prefill over the cache.
                        sel8 = self.att.select(torch_dtype(dtype), hd, opts.target, kv_fp8=True)
                        what8 = ("decode fp8 KV", model, dtype, f"{blocks * bs} tokens", sel8.decode.name, label)
                        calls.append(Call(self.module, "decode_fp8", args, what8, 3))
                        what8 = ("prefill fp8 KV", model, dtype, "paged causal", sel8.prefill.name, label)
                        args8 = (opts.target, dtype, tokens, nq, nk, hd, bs, tuple(sorted(feat.items())))
                        calls.append(Call(self.module, "prefill_fp8", args8, what8, 3))
        return calls, notes

    def run(self, call: Call, device: torch.device) -> None:
        if call.op == "prefill":
            target, dtype, t, nq, nk, hd, causal, feat = call.args
            dt = torch_dtype(dtype)
            q, k, v = empty((t, nq, hd), dt, device), empty((t, nk, hd), dt, device), empty((t, nk, hd), dt, device)
            cu = torch.tensor([0, t], dtype=torch.int32, device=device)
            self.att.prefill(q, k, v, cu, cu, t, t, causal=causal, hw=target, **_attention_kwargs(feat, nq, device))
        elif call.op == "prefill_fp8":
            target, dtype, t, nq, nk, hd, bs, feat = call.args
            blocks = -(-t // bs)
            q = empty((t, nq, hd), torch_dtype(dtype), device)
            kc = vc = empty((blocks, bs, nk, hd), torch.float8_e4m3fn, device)
            cu = torch.tensor([0, t], dtype=torch.int32, device=device)
            table = torch.zeros((1, blocks), dtype=torch.int32, device=device)
            scale = torch.ones(1, dtype=torch.float32, device=device)
            self.att.prefill(q, kc, vc, cu, cu, t, t, causal=True, hw=target, block_table=table, k_scale=scale,
                             v_scale=scale, **_attention_kwargs(feat, nq, device))
        else:
            target, dtype, seqs, nq, nk, hd, bs, blocks, feat = call.args
            dt = torch_dtype(dtype)
            fp8 = call.op == "decode_fp8"
            query = empty((seqs, nq, hd), dt, device)
            cdt = torch.float8_e4m3fn if fp8 else dt
            kc, vc = empty((1, bs, nk, hd), cdt, device), empty((1, bs, nk, hd), cdt, device)
            table = torch.zeros((seqs, blocks), dtype=torch.int32, device=device)
            lens = torch.full((seqs,), blocks * bs, dtype=torch.int32, device=device)
            kw = _attention_kwargs(feat, nq, device)
            if fp8:
                kw["k_scale"] = kw["v_scale"] = torch.ones(1, dtype=torch.float32, device=device)
            self.att.decode(query, kc, vc, table, lens, hw=target, **kw)

