"""The paged-decode cases of the vLLM comparison, shared by bench/attention.py (which times them against
vLLM's Triton decode) and bench/decode_plans.py (which times them under forced plans and depths).
Plain Python: no torch, no arguments parsed on import."""

from __future__ import annotations

# A ragged batch: each sequence's length as a fraction of the case's context, in turn.
RAGGED = (1.0, 0.73, 0.41, 0.9, 0.17, 0.58)
# (head_dim, query heads, KV heads): GQA ratios 1, 4 and 8 over head dims 64, 128 and 256.
MODELS = [(64, 16, 16), (128, 32, 8), (128, 64, 8), (256, 16, 4), (256, 16, 2)]
# (batch, context, ragged): batch 1 to 256, context 1k to 128k, equal and ragged (--quick's cases).
CASES = [
    (1, 1024, False), (1, 131072, False), (8, 8192, False), (8, 131072, True),
    (32, 32768, False), (32, 32768, True), (128, 4096, False), (256, 1024, False), (256, 8192, True),
]  # fmt: skip
# What a full (not --quick) run of bench/attention.py adds.
MORE_CASES = [(1, 8192, False), (8, 32768, False), (64, 16384, True), (128, 8192, False), (256, 4096, False)]


def lengths(batch: int, context: int, ragged: bool) -> list[int]:
    """The sequence lengths of a case: RAGGED fractions of ``context`` in turn (at least 1), or
    ``context`` each."""
    if not ragged:
        return [context] * batch
    return [max(1, int(context * RAGGED[i % len(RAGGED)])) for i in range(batch)]
