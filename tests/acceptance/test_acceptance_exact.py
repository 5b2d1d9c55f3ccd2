"""Statistical and contract tests of the `exact` rule (standard speculative sampling)."""

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
from pcgtts.engine.acceptance import Verdict, make_rule
from pcgtts.engine.ops import TORCH_OPS, Ops

V, GAMMA, ROWS = 12, 3, 200_000


# the compiled CPU loop (the default on CPU) and the torch ops (what CUDA and the relaxed rules run)
PATHS = pytest.mark.parametrize("ops", [Ops(compiled=True), TORCH_OPS], ids=["compiled", "torch-ops"])


def run_exact(p: torch.Tensor, q: torch.Tensor, seed: int, ops: Ops | None = None
              ) -> tuple[Verdict, torch.Tensor]:
    draft_probs, target_probs = batch_of(p, ROWS, GAMMA), batch_of(q, ROWS, GAMMA + 1)
    drafts = sample_drafts(draft_probs, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    return make_rule("exact", ops=ops).verify(drafts, draft_probs, target_probs, gen), drafts


@PATHS
def test_emitted_tokens_follow_target(ops):
    p, q = random_dist(V, 1), random_dist(V, 2)
    verdict, _ = run_exact(p, q, seed=10, ops=ops)
    first = verdict.tokens[:, 0]
    assert chi2_pvalue(first, q) > ALPHA
    # The same statistic has the power to see a 1% error in q.
    assert chi2_pvalue(first, perturbed(q)) < 1e-12
    # With position-independent p and q every emitted position is also distributed as q.
    second = verdict.tokens[verdict.num_emitted >= 2, 1]
    assert chi2_pvalue(second, q) > ALPHA


@PATHS
def test_acceptance_rate_and_mean_emitted_match_theory(ops):
    p, q = random_dist(V, 3), random_dist(V, 4)
    alpha = float(torch.minimum(p, q).sum())
    verdict, _ = run_exact(p, q, seed=20, ops=ops)
    accepted_first = (verdict.num_accepted >= 1).double()
    assert abs(z_score(accepted_first, alpha)) < Z_MAX
    expected_emitted = (1 - alpha ** (GAMMA + 1)) / (1 - alpha)
    assert abs(z_score(verdict.num_emitted, expected_emitted)) < Z_MAX


@PATHS
def test_verdict_layout(ops):
    p, q = random_dist(V, 5), random_dist(V, 6)
    verdict, drafts = run_exact(p, q, seed=30, ops=ops)
    n = verdict.num_accepted
    assert verdict.tokens.shape == (ROWS, GAMMA + 1) and verdict.tokens.dtype == torch.long
    assert int(n.min()) >= 0 and int(n.max()) <= GAMMA
    assert torch.equal(verdict.num_emitted, n + 1)
    positions = torch.arange(GAMMA + 1)[None, :]
    kept = positions < n[:, None]
    assert torch.equal(verdict.tokens[:, :GAMMA][kept[:, :GAMMA]], drafts[kept[:, :GAMMA]])
    assert bool((verdict.tokens[positions > n[:, None]] == -1).all())
    assert bool((verdict.tokens[positions == n[:, None]] >= 0).all())
    assert bool((verdict.groups == -1).all())
    # All outcomes, from immediate rejection to the bonus token, occur.
    assert set(n.unique().tolist()) == set(range(GAMMA + 1))


def test_identical_distributions_always_accept():
    q = random_dist(V, 7)
    verdict, _ = run_exact(q, q, seed=40)
    assert bool((verdict.num_accepted == GAMMA).all())


def test_greedy_one_hot_accepts_exactly_matching_argmax():
    # Temperature 0 turns both sides into one-hots: accept iff the draft token is the target argmax, and the
    # recovered token is the target argmax.
    vocab = 50
    target_argmax = torch.tensor([[3, 4, 5, 6], [3, 9, 5, 6], [7, 4, 5, 6]])  # [B, γ+1]
    drafts = torch.tensor([[3, 4, 5], [3, 4, 5], [3, 4, 5]])
    target = torch.nn.functional.one_hot(target_argmax, vocab).float()
    draft = torch.nn.functional.one_hot(drafts, vocab).float()
    verdict = make_rule("exact").verify(drafts, draft, target, torch.Generator().manual_seed(0))
    assert verdict.num_accepted.tolist() == [3, 1, 0]
    assert verdict.tokens.tolist() == [[3, 4, 5, 6], [3, 9, -1, -1], [7, -1, -1, -1]]


def test_same_seed_same_verdict():
    p, q = random_dist(V, 8), random_dist(V, 9)
    a, _ = run_exact(p, q, seed=50)
    b, _ = run_exact(p, q, seed=50)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.num_accepted, b.num_accepted)


def test_rejects_mismatched_shapes():
    import pytest

    probs = torch.full((2, 3, 5), 0.2)
    with pytest.raises(ValueError):
        make_rule("exact").verify(torch.zeros(2, 3, dtype=torch.long), probs, probs)
    with pytest.raises(ValueError):
        make_rule("nope")
