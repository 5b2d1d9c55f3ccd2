"""Statistical tests of the PCG rule against the closed forms of pcg-paper.md §1.7."""

from __future__ import annotations

import pytest
import torch
from acceptance_support import (
    ALPHA,
    Z_MAX,
    batch_of,
    chi2_pvalue,
    perturbed,
    random_dist,
    sample_drafts,
    z_score,
)
from pcgtts.asg_tables import ASGTable
from pcgtts.engine.acceptance import make_rule
from pcgtts.engine.ops import TORCH_OPS, Ops

V, GAMMA, ROWS = 8, 3, 200_000
# Overlapping groups: N(t) is 2 for tokens 0, 2, 3, 5 and 1 otherwise; token 7 is a singleton by omission.
GROUPS = [[0, 1, 2], [2, 3], [3, 4, 5], [5, 0], [6]]


def weights(groups: list[list[int]], vocab: int) -> torch.Tensor:
    """Equal-split w[k, t] = 1/N(t) for t ∈ G_k, written out independently of ASGTable. [M, V]"""
    member = torch.zeros(len(groups), vocab, dtype=torch.float64)
    for k, g in enumerate(groups):
        member[k, g] = 1.0
    return member / member.sum(0, keepdim=True)


def table_groups(table: ASGTable) -> list[list[int]]:
    return [table.members(k).tolist() for k in range(table.num_groups)]


def run_pcg(table: ASGTable, p: torch.Tensor, q: torch.Tensor, seed: int, **params):
    draft_probs, target_probs = batch_of(p, ROWS, GAMMA), batch_of(q, ROWS, GAMMA + 1)
    drafts = sample_drafts(draft_probs, seed)
    rule = make_rule("pcg", table=table, **params)
    return rule, rule.verify(drafts, draft_probs, target_probs, torch.Generator().manual_seed(seed + 1))


def joint_closed_form(w: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Pr(K = k, token = t) at the first position, [M, V]:
    w_{k,t} [p(t) min(1, Q_c/P_c) + q(t) [Q_c - P_c]_+ / Q_c]  (pcg-paper.md §1.7 (4), split by label)."""
    p_c, q_c = w @ p, w @ q
    accept = torch.clamp(q_c / p_c, max=1.0)
    residual = torch.clamp(q_c - p_c, min=0.0) / q_c
    return w * (p[None, :] * accept[:, None] + q[None, :] * residual[:, None])


@pytest.mark.parametrize(
    "params",
    [{"residual": "thinning"}, {"residual": "thinning", "thinning_trials": 1, "thinning_rounds": 1},
     {"residual": "enumerate"}, {"residual": "enumerate", "ops": TORCH_OPS}],
    ids=["thinning", "mostly-fallback", "enumerate-compiled", "enumerate-torch-ops"],
)
def test_first_label_and_joint_follow_closed_forms(params):
    table = ASGTable.from_groups(GROUPS, V)
    groups = table_groups(table)
    w = weights(groups, V)
    p, q = random_dist(V, 11), random_dist(V, 12)
    rule, verdict = run_pcg(table, p, q, seed=100, **params)
    label, token = verdict.groups[:, 0], verdict.tokens[:, 0]
    q_c = w @ q
    assert chi2_pvalue(label, q_c) > ALPHA
    assert chi2_pvalue(label, perturbed(q_c)) < 1e-12  # power against a 1% error
    joint = joint_closed_form(w, p, q)
    assert torch.allclose(joint.sum(), torch.tensor(1.0, dtype=torch.float64))
    assert chi2_pvalue(label * V + token, joint.flatten()) > ALPHA
    if "thinning_rounds" in params:
        assert rule.stats["fallback_rows"] > 1000  # the exact fallback really ran
    elif params["residual"] == "thinning":
        assert rule.stats["fallback_rows"] < rule.stats["rejections"] // 100


def test_thinning_alone_is_exact():
    table = ASGTable.from_groups(GROUPS, V)
    w = weights(table_groups(table), V)
    p, q = random_dist(V, 13), random_dist(V, 14)
    rule, verdict = run_pcg(table, p, q, seed=200, residual="thinning", thinning_rounds=60)
    assert rule.stats["fallback_rows"] == 0
    # Among rejected first positions the label follows R_c ∝ [Q_c - P_c]_+.
    rejected = verdict.num_accepted == 0
    residual = torch.clamp(w @ q - w @ p, min=0.0)
    assert chi2_pvalue(verdict.groups[rejected, 0], residual / residual.sum()) > ALPHA


def test_acceptance_rate_is_coarse_overlap():
    table = ASGTable.from_groups(GROUPS, V)
    w = weights(table_groups(table), V)
    p, q = random_dist(V, 15), random_dist(V, 16)
    _, verdict = run_pcg(table, p, q, seed=300)
    alpha = float(torch.minimum(w @ p, w @ q).sum())
    assert abs(z_score((verdict.num_accepted >= 1).double(), alpha)) < Z_MAX
    assert abs(z_score(verdict.num_emitted, (1 - alpha ** (GAMMA + 1)) / (1 - alpha))) < Z_MAX
    # token-level SD would accept less often with these groups
    assert alpha > float(torch.minimum(p, q).sum()) + 0.02


def test_singleton_groups_reduce_to_exact():
    table = ASGTable.from_groups([], V)
    p, q = random_dist(V, 17), random_dist(V, 18)
    _, verdict = run_pcg(table, p, q, seed=400)
    alpha = float(torch.minimum(p, q).sum())
    assert chi2_pvalue(verdict.tokens[:, 0], q) > ALPHA
    assert abs(z_score((verdict.num_accepted >= 1).double(), alpha)) < Z_MAX
    assert abs(z_score(verdict.num_emitted, (1 - alpha ** (GAMMA + 1)) / (1 - alpha))) < Z_MAX
    labelled = verdict.groups >= 0
    assert torch.equal(verdict.groups[labelled], verdict.tokens[labelled])  # group k = {k}


@pytest.mark.parametrize("ops", [Ops(compiled=True), TORCH_OPS], ids=["compiled", "torch-ops"])
@pytest.mark.parametrize("vocab", [V, 1500])  # 1,500 > 4 blocks: the two-level sampler's path too
def test_singleton_groups_replay_exact_draw_for_draw(vocab, ops):
    """With group k = {k}, enumerated PCG draws what `exact` draws (and one more uniform per row, for the
    token inside the group): identical verdicts."""
    table = ASGTable.from_groups([], vocab)
    p, q = random_dist(vocab, 21), random_dist(vocab, 22)
    rows = 4000
    draft_probs, target_probs = batch_of(p, rows, GAMMA), batch_of(q, rows, GAMMA + 1)
    drafts = sample_drafts(draft_probs, 600)
    pcg = make_rule("pcg", table=table, residual="enumerate", ops=ops)
    exact = make_rule("exact", ops=ops)
    got = pcg.verify(drafts, draft_probs, target_probs, torch.Generator().manual_seed(7))
    want = exact.verify(drafts, draft_probs, target_probs, torch.Generator().manual_seed(7))
    assert 0 < int((got.num_accepted < GAMMA).sum()) < rows  # both branches ran
    assert torch.equal(got.num_accepted, want.num_accepted)
    assert torch.equal(got.tokens, want.tokens)


def test_labels_hold_their_tokens_and_bonus_is_unlabelled():
    table = ASGTable.from_groups(GROUPS, V)
    member = weights(table_groups(table), V) > 0  # [M, V]
    p, q = random_dist(V, 19), random_dist(V, 20)
    _, verdict = run_pcg(table, p, q, seed=500)
    positions = torch.arange(GAMMA + 1)[None, :]
    emitted = positions < verdict.num_emitted[:, None]
    bonus = (positions == GAMMA) & (verdict.num_accepted[:, None] == GAMMA)
    assert bool((verdict.groups[bonus] == -1).all()) and bool((verdict.groups[~emitted] == -1).all())
    labelled = emitted & ~bonus
    assert bool(member[verdict.groups[labelled], verdict.tokens[labelled]].all())
    assert chi2_pvalue(verdict.tokens[verdict.num_accepted == GAMMA, GAMMA], q) > ALPHA
