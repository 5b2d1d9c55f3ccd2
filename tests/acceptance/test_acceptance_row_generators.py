"""Rows with their own generators verified in one call (RowGenerators) draw what they draw alone."""

from __future__ import annotations

import pytest
import torch
from acceptance_support import random_dist, sample_drafts
from pcgtts.asg_tables import ASGTable
from pcgtts.engine.acceptance import make_rule
from pcgtts.engine.acceptance.sampling import RowGenerators, uniform
from pcgtts.engine.ops import TORCH_OPS

V, GAMMA, ROWS = 60, 3, 12
GROUPS = [[0, 1, 2, 3], [2, 3, 4], [10, 11, 12, 13, 14, 15], [20, 21], [30, 31, 32, 33, 34, 35, 36, 37]]


def rows_of(seed: int, positions: int) -> torch.Tensor:
    """ROWS x positions different distributions (peaked, so that rows accept and reject) -> [R, P, V]."""
    return torch.stack([torch.stack([random_dist(V, seed + 100 * r + i, 0.3) for i in range(positions)])
                        for r in range(ROWS)]).float()


@pytest.mark.parametrize("rule", ["exact", "ssd", "pcg", "block", "pcg-block"])
def test_rows_verified_together_match_each_generator_alone(rule):
    params = {"pcg": {"table": ASGTable.from_groups(GROUPS, V), "residual": "enumerate"},
              "pcg-block": {"table": ASGTable.from_groups(GROUPS, V)}}.get(rule, {})
    verifier = make_rule(rule, **params)
    assert verifier.row_draws
    draft_probs, target_probs = rows_of(1, GAMMA), rows_of(2, GAMMA + 1)
    drafts = sample_drafts(draft_probs, 3)
    blocks = [torch.tensor([r for r in range(ROWS) if r % 3 == k]) for k in range(3)]  # interleaved rows
    together = verifier.verify(drafts, draft_probs, target_probs, RowGenerators(
        [(torch.Generator().manual_seed(40 + k), rows) for k, rows in enumerate(blocks)], ROWS))
    for k, rows in enumerate(blocks):
        alone = verifier.verify(drafts[rows], draft_probs[rows], target_probs[rows],
                                torch.Generator().manual_seed(40 + k))
        assert torch.equal(together.tokens[rows], alone.tokens)
        assert torch.equal(together.num_accepted[rows], alone.num_accepted)
        assert torch.equal(together.groups[rows], alone.groups)
    assert 0 < int((together.num_accepted < GAMMA).sum()) < ROWS  # rejections and full acceptances both ran


LARGE_V = 20_000  # beyond the compiled loops (COMPILED_MAX_V) and the one-pass sampler (SINGLE_PASS_MAX_V)
RULE_SPECS = {
    "exact": ("exact", {}), "exact-torch": ("exact", {"ops": TORCH_OPS}), "ssd": ("ssd", {"bias": 0.2}),
    "topk": ("topk", {"k": 3}), "lantern": ("lantern", {"k": 4, "delta": 0.2, "table": "groups"}),
    "pcg": ("pcg", {"table": "groups", "residual": "enumerate"}),
    "pcg-torch": ("pcg", {"table": "groups", "residual": "enumerate", "ops": TORCH_OPS}),
    "block": ("block", {}), "block-torch": ("block", {"ops": TORCH_OPS}),
    "pcg-block": ("pcg-block", {"table": "groups"}),
    "pcg-block-torch": ("pcg-block", {"table": "groups", "ops": TORCH_OPS}),
}


@pytest.mark.parametrize("vocab", [V, LARGE_V])
@pytest.mark.parametrize("spec", list(RULE_SPECS))
def test_a_seeded_rows_verdict_does_not_depend_on_its_batch_mates(spec, vocab):
    """Every rule, compiled loop or torch ops: a row with a generator of its own gets the same verdict
    verified alone as verified beside rows of other distributions and generators (each row its own
    block, as the engine verifies seeded requests)."""
    name, params = RULE_SPECS[spec]
    if params.get("table") == "groups":
        params = params | {"table": ASGTable.from_groups(GROUPS, vocab)}
    verifier = make_rule(name, **params)
    gen = torch.Generator().manual_seed(vocab)
    draft_probs = torch.softmax(3 * torch.randn(ROWS, GAMMA, vocab, generator=gen), -1)
    target_probs = torch.softmax(3 * torch.randn(ROWS, GAMMA + 1, vocab, generator=gen), -1)
    target_probs[:, :GAMMA] = 0.5 * target_probs[:, :GAMMA] + 0.5 * draft_probs  # drafts often accepted
    drafts = sample_drafts(draft_probs, 3)
    rows = [torch.tensor([r]) for r in range(ROWS)]
    together = verifier.verify(drafts, draft_probs, target_probs, RowGenerators(
        [(torch.Generator().manual_seed(70 + r), idx) for r, idx in enumerate(rows)], ROWS))
    for r in range(ROWS):
        alone = verifier.verify(drafts[r:r + 1], draft_probs[r:r + 1], target_probs[r:r + 1],
                                torch.Generator().manual_seed(70 + r))
        assert torch.equal(together.tokens[r:r + 1], alone.tokens), r
        assert torch.equal(together.groups[r:r + 1], alone.groups), r
    assert int((together.num_accepted < GAMMA).sum()) > 0  # the residual draws ran


def test_thinning_pcg_draws_per_trial_and_row_generators_check_shapes():
    assert not make_rule("pcg", table=ASGTable.from_groups(GROUPS, V), residual="thinning").row_draws
    gens = RowGenerators([(torch.Generator().manual_seed(0), torch.tensor([0, 1]))], 2)
    with pytest.raises(ValueError, match="rows of generators"):
        uniform((3, 2), gens, torch.device("cpu"))
