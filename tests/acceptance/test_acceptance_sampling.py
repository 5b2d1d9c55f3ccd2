"""The two-level inverse-CDF sampler over vocabularies spanning several blocks, and ragged segment draws."""

from __future__ import annotations

import pytest
import torch
from acceptance_support import ALPHA, chi2_pvalue, perturbed
from pcgtts.engine.acceptance import make_rule
from pcgtts.engine.acceptance.sampling import BLOCK, SINGLE_PASS_MAX_V, sample_rows, sample_segments, uniform


def sparse_dist(vocab: int, seed: int) -> torch.Tensor:
    """A distribution with a third of its tokens at zero and a wide range of magnitudes. [V] float64"""
    gen = torch.Generator().manual_seed(seed)
    w = torch.rand(vocab, generator=gen, dtype=torch.float64) ** 3
    w[torch.rand(vocab, generator=gen) < 0.33] = 0.0
    return w / w.sum()


# full blocks and a ragged tail, searched in one pass and in two levels (beyond SINGLE_PASS_MAX_V)
VOCABS = [8 * BLOCK + 113, SINGLE_PASS_MAX_V + 3 * BLOCK + 113]


@pytest.mark.parametrize("vocab", VOCABS)
def test_sample_rows_matches_the_distribution(vocab):
    probs = sparse_dist(vocab, vocab)
    rows, draws = 8, 2500  # 8 calls x 8 rows x 2,500 draws ([R, T] form) = 160k draws
    weights = (3.0 * probs).float().expand(rows, vocab).contiguous()  # unnormalised on purpose
    gen = torch.Generator().manual_seed(1)
    samples = torch.cat(
        [sample_rows(weights, gen, u=uniform((rows, draws), gen, weights.device)).flatten() for _ in range(8)]
    )
    assert bool((probs[samples] > 0).all())
    assert chi2_pvalue(samples, probs) > ALPHA
    # per-block mass, where a two-level sampler would go wrong; the test sees a 1% shift between blocks
    block_of = samples // BLOCK
    block_mass = torch.zeros(vocab // BLOCK + 1, dtype=torch.float64).index_add_(
        0, torch.arange(vocab) // BLOCK, probs
    )
    assert chi2_pvalue(block_of, block_mass) > ALPHA
    assert chi2_pvalue(block_of, perturbed(block_mass)) < 1e-6
    one_each = sample_rows(weights, gen)
    assert one_each.shape == (rows,) and bool((probs[one_each] > 0).all())


@pytest.mark.parametrize("vocab", VOCABS)
def test_sample_rows_is_the_plain_inverse_cdf(vocab):
    """Whole zero blocks, a ragged tail and extreme uniforms: never a zero-probability token, and the same
    token as a one-level float64 inverse CDF for the same uniform (the engine's draws are seeded by u)."""
    gen = torch.Generator().manual_seed(0)
    v = vocab
    probs = torch.rand(v, generator=gen) ** 4
    probs[torch.randperm(v, generator=gen)[:v // 3]] = 0  # zero-probability tokens, whole runs of them
    probs[BLOCK:BLOCK + 300] = 0
    probs /= probs.sum()
    n = 60_000
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    u[:3] = torch.tensor([0.0, 1 - 1e-16, 0.5], dtype=torch.float64)
    draws = torch.cat([sample_rows(probs.expand(len(c), v), None, c) for c in u.split(5000)])
    assert bool((probs[draws] > 0).all())
    assert chi2_pvalue(draws, probs.double() / probs.double().sum()) > ALPHA
    cdf = probs.double().cumsum(0)
    plain = torch.searchsorted(cdf, (u[:1000] * cdf[-1])[:, None], right=True)[:, 0]
    assert (draws[:1000] == plain).float().mean() > 0.99


def test_sample_segments_matches_weights():
    # 100k copies of two segments, [0.2, 0, 0.8] and [5, 1, 0, 4], drawn in one call
    reps = 100_000
    weights = torch.tensor([0.2, 0.0, 0.8, 5.0, 1.0, 0.0, 4.0], dtype=torch.float64).repeat(reps)
    starts = torch.stack([torch.arange(reps) * 7, torch.arange(reps) * 7 + 3], dim=1).flatten()
    indptr = torch.cat([starts, torch.tensor([7 * reps])])
    pos = sample_segments(weights, indptr, torch.Generator().manual_seed(2)) - starts
    assert chi2_pvalue(pos[0::2], torch.tensor([0.2, 0.0, 0.8])) > ALPHA
    assert chi2_pvalue(pos[1::2], torch.tensor([0.5, 0.1, 0.0, 0.4])) > ALPHA


def test_exact_rule_over_a_multi_block_vocabulary():
    vocab, rows = 4 * BLOCK + 7, 40_000
    p, q = sparse_dist(vocab, 3), sparse_dist(vocab, 4)
    p = 0.5 * p + 0.5 * q  # overlapping supports so that some drafts are accepted
    draft_probs, target_probs = p.float().expand(rows, 1, vocab), q.float().expand(rows, 2, vocab)
    gen = torch.Generator().manual_seed(5)
    drafts = torch.multinomial(p.float(), rows, replacement=True, generator=gen).view(rows, 1)
    verdict = make_rule("exact").verify(drafts, draft_probs, target_probs, gen)
    assert chi2_pvalue(verdict.tokens[:, 0], q) > ALPHA


@pytest.mark.parametrize("vocab", VOCABS)
def test_a_rows_draws_do_not_depend_on_how_many_rows_share_the_call(vocab):
    """The same weights and uniforms give a row the same tokens alone and among any number of rows: the
    search (one pass or two levels, which round differently) is chosen by the row length alone (it was
    chosen by rows x length, so eight rows of ~9,000 tokens took the other search than one)."""
    gen = torch.Generator().manual_seed(4)
    weights = torch.rand(8, vocab, generator=gen) ** 3
    u = torch.rand(8, 2_000, generator=gen, dtype=torch.float64)
    alone = sample_rows(weights[:1], None, u[:1])
    for rows in (2, 8):
        assert torch.equal(sample_rows(weights[:rows], None, u[:rows])[:1], alone), rows


def test_a_segments_draw_does_not_depend_on_the_other_segments():
    gen = torch.Generator().manual_seed(5)
    sizes = torch.randint(1, 40, (30,), generator=gen)
    indptr = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
    weights = torch.rand(int(indptr[-1]), generator=gen, dtype=torch.float64) * 1e3
    u = torch.rand(30, generator=gen, dtype=torch.float64)
    together = sample_segments(weights, indptr, None, u)
    for r in range(30):
        lo, hi = int(indptr[r]), int(indptr[r + 1])
        alone = sample_segments(weights[lo:hi], torch.tensor([0, hi - lo]), None, u[r:r + 1])
        assert int(together[r]) - lo == int(alone[0]), r
