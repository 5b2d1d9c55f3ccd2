"""The relaxed baselines (ssd, topk, lantern): their limits and their closed-form first-token laws."""

from __future__ import annotations

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
from pcgtts.asg_tables.neighbours import NeighbourIndex, nearest_neighbours
from pcgtts.engine.acceptance import make_rule

V, GAMMA, ROWS = 10, 3, 200_000


def run(rule, p: torch.Tensor, q: torch.Tensor, seed: int):
    draft_probs, target_probs = batch_of(p, ROWS, GAMMA), batch_of(q, ROWS, GAMMA + 1)
    drafts = sample_drafts(draft_probs, seed)
    return rule.verify(drafts, draft_probs, target_probs, torch.Generator().manual_seed(seed + 1))


def first_token_law(p: torch.Tensor, accept: torch.Tensor, residual_of: torch.Tensor) -> torch.Tensor:
    """Pr(first emitted = t) = p(t) a(t) + Σ_x p(x) (1 - a(x)) r_x(t).

    accept a: [V] per draft token x; residual_of r: [V, V], row x the recovery law after rejecting x."""
    return p * accept + ((p * (1 - accept))[:, None] * residual_of).sum(0)


def normalized_residual(q: torch.Tensor, subtract: torch.Tensor) -> torch.Tensor:
    r = torch.clamp(q - subtract, min=0.0)
    return r / r.sum(-1, keepdim=True)


def test_ssd_zero_bias_is_exact():
    p, q = random_dist(V, 31), random_dist(V, 32)
    verdict = run(make_rule("ssd", bias=0.0), p, q, seed=600)
    assert chi2_pvalue(verdict.tokens[:, 0], q) > ALPHA
    assert abs(z_score((verdict.num_accepted >= 1).double(), float(torch.minimum(p, q).sum()))) < Z_MAX


def test_ssd_bias_follows_its_closed_form():
    p, q = random_dist(V, 33), random_dist(V, 34)
    bias = 0.3
    verdict = run(make_rule("ssd", bias=bias), p, q, seed=700)
    accept = torch.clamp(q / p + bias, max=1.0)
    law = first_token_law(p, accept, normalized_residual(q, p).expand(V, V))
    assert chi2_pvalue(verdict.tokens[:, 0], law) > ALPHA
    assert chi2_pvalue(verdict.tokens[:, 0], perturbed(law)) < 1e-12
    assert abs(z_score((verdict.num_accepted >= 1).double(), float((p * accept).sum()))) < Z_MAX


def test_topk_limits_and_law():
    p, q = random_dist(V, 35), random_dist(V, 36)
    assert bool((run(make_rule("topk", k=V), p, q, seed=800).num_accepted == GAMMA).all())
    k = 3
    verdict = run(make_rule("topk", k=k), p, q, seed=900)
    in_top = torch.zeros(V, dtype=torch.float64)
    in_top[torch.topk(q, k).indices] = 1.0
    law = first_token_law(p, in_top, q.expand(V, V))
    assert chi2_pvalue(verdict.tokens[:, 0], law) > ALPHA
    assert abs(z_score((verdict.num_accepted >= 1).double(), float((p * in_top).sum()))) < Z_MAX


def test_topk_never_accepts_a_token_the_target_forbids():
    p = random_dist(V, 37)
    q = random_dist(V, 38)
    q[0] = 0.0
    q = q / q.sum()
    verdict = run(make_rule("topk", k=V), p, q, seed=1000)
    assert not bool((verdict.tokens == 0).any())


def test_lantern_follows_its_closed_form():
    p, q = random_dist(V, 39), random_dist(V, 40)
    gen = torch.Generator().manual_seed(3)
    nb = torch.stack([torch.randperm(V, generator=gen) for _ in range(V)])
    nb = torch.stack([row[row != t][:4] for t, row in enumerate(nb)])  # [V, 4] neighbours, no self
    delta = 0.15
    rule = make_rule("lantern", k=4, delta=delta, neighbours=NeighbourIndex(nb))
    verdict = run(rule, p, q, seed=1100)
    relaxed = q.clone()
    residual_of = torch.empty(V, V, dtype=torch.float64)
    for x in range(V):
        mass = 0.0
        for n in nb[x].tolist():  # nearest first, stop before the running sum exceeds δ
            if mass + q[n] > delta:
                break
            mass += float(q[n])
        relaxed[x] += mass
        p_zeroed = p.clone()
        p_zeroed[[x, *nb[x].tolist()]] = 0.0
        residual_of[x] = normalized_residual(q, p_zeroed)
    accept = torch.clamp(relaxed / p, max=1.0)
    law = first_token_law(p, accept, residual_of)
    assert chi2_pvalue(verdict.tokens[:, 0], law) > ALPHA
    assert abs(z_score((verdict.num_accepted >= 1).double(), float((p * accept).sum()))) < Z_MAX
    assert float((p * accept).sum()) > float(torch.minimum(p, q).sum()) + 0.02  # it does relax


def test_nearest_neighbours_are_ordered_by_cosine():
    emb = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.7, 0.7], [-1.0, 0.0]])
    index = nearest_neighbours(emb, 3, offset=5)
    assert index.ids.tolist()[0] == [6, 8, 7]  # rows 1 (cos≈.99), 3 (.71), 2 (0), shifted by the offset
    assert index.of(torch.tensor([5, 0, 10])).tolist() == [[6, 8, 7], [-1, -1, -1], [-1, -1, -1]]
