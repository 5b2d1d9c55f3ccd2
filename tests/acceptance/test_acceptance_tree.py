"""A token tree's first level (engine/acceptance/tree.py): k candidates drawn without replacement (of tokens,
or of whole ASG groups), verified by recursive rejection sampling over them. The emitted token must follow
the target q with singleton groups (exact), and the emitted group label the coarse target Q_c with
overlapping groups (pcg), for any draft p; more candidates must accept more often."""

from __future__ import annotations

import pytest
import torch
from acceptance_support import Z_MAX, chi2_pvalue, perturbed, random_dist, z_score
from pcgtts.asg_tables import ASGTable
from pcgtts.engine.acceptance.tree import draw_siblings, sharing_a_group, verify_siblings
from pcgtts.engine.ops.verify import GroupLayout, singleton_layout

ALPHA = 1e-3  # the chi-square tests pass at p > 0.001
VOCAB = 8
ROWS = 60_000
# overlapping groups over 8 tokens: 1 and 5 sit in two groups each, 7 alone
OVERLAPPING = [[0, 1], [1, 2], [3, 4, 5], [5, 6]]


def uniforms(rows: int, cols: int, seed: int) -> torch.Tensor:
    return torch.rand(rows, cols, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def run_tree(layout: GroupLayout, p: torch.Tensor, q: torch.Tensor, k: int, seed: int, rows: int = ROWS):
    """Draw k candidates from p (Float64[V]) in each of `rows` rows and verify them against q."""
    p_rows, q_rows = p.float().expand(rows, -1), q.float().expand(rows, -1)
    siblings, probs = draw_siblings(layout, p_rows, uniforms(rows, k, seed))
    verdict = verify_siblings(layout, siblings, probs, q_rows, uniforms(rows, k + 2, seed + 1))
    return siblings, probs, verdict


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("case", range(3))
def test_token_level_tree_emits_the_target_law(k, case):
    p, q = random_dist(VOCAB, 10 * case), random_dist(VOCAB, 10 * case + 1)
    _, _, verdict = run_tree(singleton_layout(VOCAB), p, q, k, seed=100 + case)
    assert bool((verdict.token >= 0).all())
    assert chi2_pvalue(verdict.token, q) > ALPHA
    assert chi2_pvalue(verdict.token, perturbed(q)) < 1e-9  # power against a 1% error


@pytest.mark.parametrize("k", [2, 3])
def test_group_level_tree_emits_the_coarse_target_law(k):
    table = ASGTable.from_groups(OVERLAPPING, VOCAB)
    layout = GroupLayout(table)
    for case in range(3):
        p, q = random_dist(VOCAB, 50 + case, 0.7), random_dist(VOCAB, 60 + case, 0.7)
        _, _, verdict = run_tree(layout, p, q, k, seed=200 + case)
        q_c = table.coarse(q[None])[0]  # [M]
        assert abs(float(q_c.sum()) - 1.0) < 1e-9
        assert chi2_pvalue(verdict.group, q_c) > ALPHA
        # the label is a group of the emitted token
        assert bool(sharing_a_group(layout, verdict.token).gather(1, verdict.token[:, None]).all())
        members = table.index()
        for g in verdict.group.unique().tolist():
            in_group = members.group_members[members.group_indptr[g]:members.group_indptr[g + 1]]
            tokens = verdict.token[verdict.group == g]
            assert bool(torch.isin(tokens, in_group).all())


def test_verification_with_the_wrong_candidate_laws_is_detected():
    """Negative control: testing every candidate against the plain draft p, as if drawn with replacement,
    is what the without-replacement draw must not do; the chi-square sees the bias."""
    layout = singleton_layout(VOCAB)
    p, q = random_dist(VOCAB, 3, 0.5), random_dist(VOCAB, 4, 0.5)
    siblings, probs, _ = run_tree(layout, p, q, 3, seed=7)
    naive = p.float().expand_as(probs[:, 0]).unsqueeze(1).expand_as(probs).clone()
    wrong = verify_siblings(layout, siblings, naive, q.float().expand(ROWS, -1), uniforms(ROWS, 5, 8))
    assert chi2_pvalue(wrong.token, q) < 1e-9


@pytest.mark.parametrize("grouped", [False, True], ids=["tokens", "groups"])
def test_candidates_never_repeat_a_token_or_share_a_group(grouped):
    table = ASGTable.from_groups(OVERLAPPING if grouped else [], VOCAB)
    layout = GroupLayout(table) if grouped else singleton_layout(VOCAB)
    p = random_dist(VOCAB, 9, 0.5)
    siblings, probs, _ = run_tree(layout, p, p, 3, seed=11, rows=4000)
    for i in range(3):
        present = siblings[:, i] >= 0
        # a present candidate had mass under the law it was drawn from; that law sums to one
        assert bool((probs[present, i].gather(1, siblings[present, i][:, None]) > 0).all())
        assert torch.allclose(probs[present, i].sum(-1), torch.ones(int(present.sum())), atol=1e-5)
        for j in range(i):
            shared = sharing_a_group(layout, siblings[:, j].clamp(min=0))
            clash = shared.gather(1, siblings[:, i].clamp(min=0)[:, None])[:, 0] & present
            assert not bool(clash.any())


def test_a_draft_with_no_mass_left_has_no_more_candidates():
    """p on one group only: the first candidate takes the whole mass; the rest are absent (token -1, zero
    law), and verification still emits the target's law."""
    table = ASGTable.from_groups([[0, 1, 2]], VOCAB)
    layout = GroupLayout(table)
    p = torch.zeros(VOCAB, dtype=torch.float64)
    p[[0, 1, 2]] = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = random_dist(VOCAB, 21)
    siblings, probs, verdict = run_tree(layout, p, q, 3, seed=13)
    assert bool((siblings[:, 0] >= 0).all()) and bool((siblings[:, 1:] == -1).all())
    assert float(probs[:, 1:].abs().sum()) == 0.0
    assert bool((verdict.chosen <= 0).all())
    assert chi2_pvalue(verdict.group, table.coarse(q[None])[0]) > ALPHA


def test_more_candidates_accept_more_often():
    """Recursive rejection sampling over k candidates accepts one at least as often as one candidate alone
    (each rejection passes on a residual the next candidate may fit)."""
    layout = singleton_layout(VOCAB)
    p, q = random_dist(VOCAB, 30, 0.5), random_dist(VOCAB, 31, 0.5)
    _, _, one = run_tree(layout, p, q, 1, seed=40)
    _, _, three = run_tree(layout, p, q, 3, seed=40)
    single_rate = float(torch.minimum(p, q).sum())  # Σ min(p, q): token-level acceptance of one draft
    assert abs(z_score((one.chosen >= 0).double(), single_rate)) < Z_MAX
    gain = (three.chosen >= 0).double().mean() - (one.chosen >= 0).double().mean()
    assert float(gain) > 0.05


def test_the_same_uniforms_give_the_same_tree_and_verdict():
    table = ASGTable.from_groups(OVERLAPPING, VOCAB)
    layout = GroupLayout(table)
    p, q = random_dist(VOCAB, 70), random_dist(VOCAB, 71)
    first = run_tree(layout, p, q, 3, seed=5, rows=2000)
    second = run_tree(layout, p, q, 3, seed=5, rows=2000)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    for field in ("chosen", "token", "group"):
        assert torch.equal(getattr(first[2], field), getattr(second[2], field))
    other = run_tree(layout, p, q, 3, seed=6, rows=2000)
    assert not torch.equal(first[2].token, other[2].token)
