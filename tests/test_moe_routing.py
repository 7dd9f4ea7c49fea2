"""generated/moe.py's routers against a float64 reference written from vLLM's published routing
(``grouped_topk`` in vllm/model_executor/layers/fused_moe, DeepSeek-V3's): softmax or sigmoid
scores; an optional score-correction bias that chooses the experts but does not weight them;
group-limited top-k (a group's score is its largest score, or with a bias the sum of its two
largest biased scores; the topk_group best groups are kept); renormalization, then
routed_scaling_factor; and vLLM's rule for non-finite scores (set to 0 before choosing, vLLM
PR 39391), so that NaN or Inf logits never give NaN weights.

Logits are distinct multiples of a step so that no two scores are near a tie and float32 and
float64 choose alike; among exact ties (the zeroed rows) the lowest index wins, as a stable sort.
Shapes are tiny: the kernels run in Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch

from generated import moe as M
from kernel_cases import DEVICE, seeded  # noqa: F401  (autouse fixture: a fixed seed per test)


def reference(logits, k, renormalize, scoring="softmax", bias=None, groups=1, topk_group=1, scale=1.0):
    """(weights float64 [T, k], ids [T, k]) by the published semantics, in float64."""
    x = logits.cpu().double()
    T, E = x.shape
    scores = torch.softmax(x, dim=-1) if scoring == "softmax" else torch.sigmoid(x)
    scores = torch.nan_to_num(scores, nan=0.0, posinf=0.0, neginf=0.0)
    choose = scores + bias.cpu().double()[None, :] if bias is not None else scores.clone()
    if groups > 1:
        per_group = choose.view(T, groups, E // groups)
        if bias is not None:
            group_scores = per_group.topk(2, dim=-1).values.sum(dim=-1)
        else:
            group_scores = per_group.max(dim=-1).values
        order = torch.sort(group_scores, dim=-1, descending=True, stable=True).indices
        keep = torch.zeros(T, groups, dtype=torch.bool)
        keep.scatter_(1, order[:, :topk_group], True)
        choose = choose.masked_fill(~keep.repeat_interleave(E // groups, dim=1), float("-inf"))
    ids = torch.sort(choose, dim=-1, descending=True, stable=True).indices[:, :k]
    weights = scores.gather(1, ids)
    if renormalize:
        total = weights.sum(dim=-1, keepdim=True)
        weights = weights / torch.where(total > 0, total, torch.ones_like(total))
    return weights * scale, ids


def spread_logits(T, E, step=0.07):
    """[T, E] float32: each row a random permutation of distinct, evenly spaced values."""
    rows = [torch.randperm(E).float() * step - E * step / 2 for _ in range(T)]
    return torch.stack(rows)


def check(got, want):
    weights, ids = got
    want_w, want_ids = want
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    assert ids.cpu().tolist() == want_ids.tolist()
    torch.testing.assert_close(weights.cpu().double(), want_w, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize(
    "T, E, k, scoring, biased, groups, topk_group, renormalize, scale, dtype",
    [
        (3, 64, 6, "sigmoid", True, 8, 3, True, 2.5, torch.float32),  # DeepSeek-V3's shape, scaled down
        (3, 64, 4, "softmax", False, 4, 2, False, 1.0, torch.float16),  # group max, no bias
        (4, 48, 5, "sigmoid", False, 1, 1, True, 1.0, torch.float32),  # sigmoid alone, 48 experts
        (4, 32, 1, "softmax", True, 1, 1, False, 1.0, torch.float32),  # bias without groups, k = 1
        (70, 16, 2, "sigmoid", True, 4, 2, True, 1.5, torch.float32),  # tiles of tokens (T > 64)
    ],
)
def test_grouped_topk_matches_the_published_semantics(
    T, E, k, scoring, biased, groups, topk_group, renormalize, scale, dtype
):
    logits = spread_logits(T, E).to(dtype)
    # A bias that changes which experts win: as large as the score differences, some negative.
    bias = (torch.randperm(E).float() * 0.013 - 0.2) if biased else None
    got = M.grouped_topk(
        logits.to(DEVICE), k, renormalize, scoring_func=scoring,
        e_score_correction_bias=None if bias is None else bias.to(DEVICE), num_expert_group=groups,
        topk_group=topk_group, routed_scaling_factor=scale,
    )  # fmt: skip
    want = reference(logits, k, renormalize, scoring, bias, groups, topk_group, scale)
    check(got, want)
    if biased:
        # The bias chose differently from the scores alone in at least one row: the case means something.
        plain = reference(logits, k, renormalize, scoring, None, groups, topk_group, scale)[1]
        assert not torch.equal(plain, want[1])


def test_grouped_topk_with_the_defaults_is_topk_softmax():
    logits = spread_logits(6, 24).to(DEVICE)
    a, b = M.grouped_topk(logits, 3, True), M.topk_softmax(logits, 3, True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    check(b, reference(logits, 3, True))


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renormalize", [True, False])
def test_non_finite_logits_give_finite_weights(scoring, renormalize):
    T, E, k = 6, 16, 4
    logits = spread_logits(T, E)
    logits[1, 5] = float("nan")  # one NaN: softmax's whole row is NaN, sigmoid's one score
    logits[2, :] = float("nan")
    logits[3, 7] = float("inf")
    logits[4, :] = float("-inf")
    logits[5, 2] = float("-inf")
    if scoring == "softmax":
        got = M.topk_softmax(logits.to(DEVICE), k, renormalize)
    else:
        got = M.grouped_topk(logits.to(DEVICE), k, renormalize, scoring_func="sigmoid")
    assert torch.isfinite(got[0]).all()
    want = reference(logits, k, renormalize, scoring)
    check(got, want)
    # Rows whose scores are all zeroed route to experts 0..k-1 (distinct ids) with weight 0.
    if scoring == "softmax":
        for row in (1, 2, 3, 4):
            assert got[1][row].cpu().tolist() == list(range(k))
            assert got[0][row].abs().sum().item() == 0.0


def test_grouped_topk_non_finite_logits_with_groups_and_bias():
    T, E, k = 3, 32, 4
    logits = spread_logits(T, E)
    logits[0, :] = float("nan")
    logits[2, 9] = float("inf")
    bias = torch.randperm(E).float() * 0.01
    got = M.grouped_topk(
        logits.to(DEVICE), k, True, scoring_func="sigmoid", e_score_correction_bias=bias.to(DEVICE),
        num_expert_group=4, topk_group=2,
    )  # fmt: skip
    assert torch.isfinite(got[0]).all()
    check(got, reference(logits, k, True, "sigmoid", bias, 4, 2))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"scoring_func": "tanh"}, "scoring_func must be one of"),
        ({"num_expert_group": 3}, "num_expert_group must be a power of two dividing"),
        ({"num_expert_group": 4, "topk_group": 5}, "topk_group must be at most"),
        ({"num_expert_group": 8, "topk_group": 1}, "k 4 is more than the 2 experts"),
        ({"e_score_correction_bias": torch.zeros(15)}, "e_score_correction_bias must be a float tensor of shape (16,)"),
        ({"routed_scaling_factor": float("nan")}, "routed_scaling_factor must be a finite number"),
    ],
)
def test_grouped_topk_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match="grouped_topk: " + message.replace("(", r"\(").replace(")", r"\)")):
        M.grouped_topk(torch.zeros(2, 16, device=DEVICE), 4, True, **kwargs)
