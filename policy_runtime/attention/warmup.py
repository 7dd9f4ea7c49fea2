"""generated/attention.py's warm-up driver (hand-written; policy_runtime/warmup/ runs it).

Calls covered, in the dtypes asked: prefill (causal and not), the causal prefill over a paged
16-bit cache and paged decode (the decode kernel, and the V2 merge in each of its launch shapes)
per model whose head_dim the kernels serve, in each feature set its layers use
(``attention_feature_sets``: soft-cap, ALiBi, sinks on every layer, a sliding window on its local
ones); on targets with e4m3fn also decode and the paged causal prefill over an fp8 KV cache
(float32 tensor scales).  Argument classes:
no length, token or sequence count reaches a specialized argument (lengths are read from
cu_seqlens / seq_lens, grids carry the counts; partition counts, limits, window bounds and the
block tables' row stride, the longest sequence's blocks, are ``do_not_specialize``); the KV-head
group, head strides and caches' strides follow from the model and the block size; index tensors
are int32 (the entry points take no other) and the V2 workspaces are 16-byte aligned.  What
varies is the layout of q, k and v: packed, or views of a fused qkv projection (rows
(num_heads + 2 * num_kv_heads) * head_dim apart; ``QKV_LAYOUTS``): one call per class of their
row strides (``int_class``) the model's dims give.  A head_dim is a multiple of 8, so every head
of such a view starts 16-byte aligned.  Other feature sets compile on first use, as do a
registered vendor decode kernel (nothing to compile) and the PyTorch path of long sequences.
"""

from __future__ import annotations

import itertools
from typing import Any, Optional

import torch

from ..warmup.calls import Call, Options, empty, first_of_each_class, int_class, torch_dtype
from .ops import decode_plan, merge_is_wide

__all__ = ["AttentionDriver", "attention_feature_sets", "QKV_LAYOUTS", "layout_rows"]


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
    feat = dict(items)
    out: dict[str, Any] = {}
    if "window" in feat:
        out["window_size"] = (feat["window"] - 1, 0)  # a model's sliding_window W: flash-attn's (W - 1, 0)
    if "softcap" in feat:
        out["softcap"] = feat["softcap"]
    if feat.get("alibi"):
        out["alibi_slopes"] = empty((heads,), torch.float32, device)
    if feat.get("sinks"):
        out["sinks"] = empty((heads,), torch.float32, device)
    return out


# How a call's q, k and v lie in memory: packed tensors, or views of one fused qkv projection.
QKV_LAYOUTS = ("packed", "qkv view")


def layout_rows(layout: str, nq: int, nk: int, hd: int) -> tuple[int, int]:
    """(q's, k's and v's) row strides, in elements, of a layout of ``QKV_LAYOUTS``."""
    if layout == "packed":
        return nq * hd, nk * hd
    return (nq + 2 * nk) * hd, (nq + 2 * nk) * hd


def _qkv(layout: str, t: int, nq: int, nk: int, hd: int, dtype: torch.dtype, device: torch.device) -> tuple:
    # q [t, nq, hd], k and v [t, nk, hd] in a layout of QKV_LAYOUTS.
    if layout == "packed":
        return empty((t, nq, hd), dtype, device), empty((t, nk, hd), dtype, device), empty((t, nk, hd), dtype, device)
    q, k, v = empty((t, (nq + 2 * nk) * hd), dtype, device).split([nq * hd, nk * hd, nk * hd], dim=-1)
    return q.view(t, nq, hd), k.view(t, nk, hd), v.view(t, nk, hd)


class AttentionDriver:
    """generated/attention.py's calls: prefill (causal and not), paged prefill and paged decode
    (the decode kernel and the V2 merge) per model whose head_dim the kernels serve, dtype,
    feature set the model's layers use (``attention_feature_sets``) and class of q/k/v layout
    (``prefill_classes``, ``query_classes``)."""

    def __init__(self, module: str, att: Any) -> None:
        self.module, self.att = module, att

    @staticmethod
    def prefill_classes(nq: int, nk: int, hd: int) -> list[tuple[str, tuple]]:
        """(layout, class) of an unpaged prefill: the classes of q's and of k's and v's row
        strides, one layout of each class the model's dims give."""
        rows = [(lay, layout_rows(lay, nq, nk, hd)) for lay in QKV_LAYOUTS]
        return first_of_each_class([(lay, (int_class(q), int_class(kv))) for lay, (q, kv) in rows])

    @staticmethod
    def query_classes(nq: int, nk: int, hd: int) -> list[tuple[str, tuple]]:
        """(layout, class) of a call over a paged cache (decode, paged prefill): the class of the
        query's row stride (the caches' strides are the model's)."""
        return first_of_each_class([(lay, (int_class(layout_rows(lay, nq, nk, hd)[0]),)) for lay in QKV_LAYOUTS])

    @staticmethod
    def describe_class(layout: str, c: tuple) -> str:
        return f"{layout}: q rows {c[0]}" + (f", k/v rows {c[1]}" if len(c) > 1 else "")

    def calls(self, opts: Options) -> tuple[list[Call], list[str]]:
        calls, notes = [], []
        other = opts.pick == "other"
        fp8 = opts.target not in self.att.fp8_unserved
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
            full, paged = self.prefill_classes(nq, nk, hd), self.query_classes(nq, nk, hd)
            bs = opts.block_size
            for dtype in opts.dtypes:
                tokens = 37 if other else 16
                for label, feat in attention_feature_sets(dims):
                    items = tuple(sorted(feat.items()))
                    # The records a call of this set selects (its keys are Features.uses' names).
                    sel = self.att.select(torch_dtype(dtype), hd, opts.target, uses=frozenset(feat))
                    for layout, c in full:
                        for causal in (True, False):
                            what = ("prefill", model, dtype, "causal" if causal else "full", sel.prefill.name, label,
                                    self.describe_class(layout, c))  # fmt: skip
                            args: tuple[Any, ...] = (opts.target, dtype, tokens, nq, nk, hd, causal, items, layout)
                            calls.append(Call(self.module, "prefill", args, what, 3))
                    # A context past v1_v2_threshold (and not past the PyTorch path's threshold, where
                    # the lengths would go to the host): the decode kernel and the merge, one launch
                    # each.  A windowed call's decode kernel is its own specialization and the merge
                    # is the same kernel as the model's other set's: a context of at most one
                    # partition (V1 at any batch) compiles it alone.
                    cfg = sel.config
                    limit = cfg.v1_v2_threshold + 1
                    if limit > cfg.pytorch_decode_threshold:
                        limit = cfg.v1_v2_threshold  # no V2 on this target: the decode kernel alone
                    if "window" in feat:
                        limit = min(feat["window"], cfg.partition_size)
                    blocks = -(-limit // bs)
                    seqs = 3 if other else 1
                    for layout, c in paged:
                        desc = self.describe_class(layout, c)
                        # The causal prefill over the paged 16-bit cache (chunked prefill).
                        what = ("prefill paged", model, dtype, "paged causal", sel.prefill.name, label, desc)
                        args = (opts.target, dtype, tokens, nq, nk, hd, bs, items, layout)
                        calls.append(Call(self.module, "prefill_paged", args, what, 3))
                        what = ("decode", model, dtype, f"{blocks * bs} tokens", sel.decode.name, label, desc)
                        args = (opts.target, dtype, seqs, nq, nk, hd, bs, blocks, items, layout)
                        calls.append(Call(self.module, "decode", args, what, 3))
                        if fp8:
                            # Over an fp8 (e4m3fn) KV cache: its own decode tiles (the length as
                            # above: its V2 partitions are no longer than the 16-bit ones) and the
                            # paged causal prefill over the cache.
                            sel8 = self.att.select(torch_dtype(dtype), hd, opts.target, kv_fp8=True)
                            what8 = ("decode fp8 KV", model, dtype, f"{blocks * bs} tokens", sel8.decode.name, label,
                                     desc)  # fmt: skip
                            calls.append(Call(self.module, "decode_fp8", args, what8, 3))
                            what8 = ("prefill fp8 KV", model, dtype, "paged causal", sel8.prefill.name, label, desc)
                            args8 = (opts.target, dtype, tokens, nq, nk, hd, bs, items, layout)
                            calls.append(Call(self.module, "prefill_fp8", args8, what8, 3))
        return calls, notes

    def run(self, call: Call, device: torch.device) -> None:
        if call.op == "prefill":
            target, dtype, t, nq, nk, hd, causal, feat, layout = call.args
            q, k, v = _qkv(layout, t, nq, nk, hd, torch_dtype(dtype), device)
            cu = torch.tensor([0, t], dtype=torch.int32, device=device)
            self.att.prefill(q, k, v, cu, cu, t, t, causal=causal, hw=target, **_attention_kwargs(feat, nq, device))
        elif call.op in ("prefill_paged", "prefill_fp8"):
            target, dtype, t, nq, nk, hd, bs, feat, layout = call.args
            blocks = -(-t // bs)
            q = _qkv(layout, t, nq, nk, hd, torch_dtype(dtype), device)[0]
            cdt = torch.float8_e4m3fn if call.op == "prefill_fp8" else torch_dtype(dtype)
            kc = vc = empty((blocks, bs, nk, hd), cdt, device)
            cu = torch.tensor([0, t], dtype=torch.int32, device=device)
            table = torch.zeros((1, blocks), dtype=torch.int32, device=device)
            kw = _attention_kwargs(feat, nq, device)
            if call.op == "prefill_fp8":
                kw["k_scale"] = kw["v_scale"] = torch.ones(1, dtype=torch.float32, device=device)
            self.att.prefill(q, kc, vc, cu, cu, t, t, causal=True, hw=target, block_table=table, **kw)
        else:
            target, dtype, seqs, nq, nk, hd, bs, blocks, feat, layout = call.args
            dt = torch_dtype(dtype)
            fp8 = call.op == "decode_fp8"
            cdt = torch.float8_e4m3fn if fp8 else dt
            kc, vc = empty((1, bs, nk, hd), cdt, device), empty((1, bs, nk, hd), cdt, device)
            kw = _attention_kwargs(feat, nq, device)
            if fp8:
                kw["k_scale"] = kw["v_scale"] = torch.ones(1, dtype=torch.float32, device=device)

            def decode(n: int) -> None:
                # n sequences of blocks * bs tokens each, every table entry block 0.
                query = _qkv(layout, n, nq, nk, hd, dt, device)[0]
                table = torch.zeros((n, blocks), dtype=torch.int32, device=device)
                lens = torch.full((n,), blocks * bs, dtype=torch.int32, device=device)
                self.att.decode(query, kc, vc, table, lens, hw=target, **kw)

            decode(seqs)
            # The V2 merge's other launch shape: one more call of the same class (its decode kernel
            # compiled above), of the first batch size whose plan takes the other shape.
            items = dict(feat)
            sel = self.att.select(dt, hd, target, uses=frozenset(items), kv_fp8=fp8)
            bound = min(blocks * bs, items.get("window", blocks * bs))

            def shape(n: int) -> Optional[bool]:
                parts = decode_plan(n, nk, bound, sel.config, sel.launch)[2]
                return merge_is_wide(n, nq, hd, parts) if parts > 1 else None

            first = shape(seqs)
            n = next((n for n in itertools.chain([1], range(seqs, 4096)) if shape(n) not in (None, first)), None)
            if first is not None and n is not None:
                decode(n)
