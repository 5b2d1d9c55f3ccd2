"""Token trees in the engine (engine/spec_tree.py): k candidates for the first draft position, each with a
chain of its own, verified in one target forward. The emitted tokens follow the processed target (chi-square
against transformers' model, as tests/engine/test_engine_sampling.py does for chains), the candidates raise
the first position's acceptance over a chain's, seeded requests reproduce whatever shares the batch, and
what trees do not run on is refused."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from engine_support import engine_config, hf_model, save_feature_head, save_tiny_llama
from pcgtts.asg_tables import ASGTable
from pcgtts.engine import Engine, SamplingParams
from test_engine_sampling import ALPHA, GROUP, PROMPT, SETTINGS, V, chi2_pvalue, reference_probs


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    target = save_tiny_llama(root / "target", vocab=V, hidden=32, heads=2, kv_heads=1, intermediate=64,
                             layers=2, seed=21, init_std=0.3)
    head = save_feature_head(target, root / "head")
    ASGTable.from_groups([], V).save(root / "singletons.asg")
    ASGTable.from_groups([GROUP, [1, 2], [2, 3, 4]], V).save(root / "groups.asg")
    return target, head, root


def reference_second_and_third(target_dir, params: SamplingParams) -> torch.Tensor:
    """P(x2, x3) [V, V] of the processed target (x1 summed out): a feature head's first step is the target's
    alone, so x2 is the tree's first position and x3 its branches' second."""
    hf = hf_model(target_dir)
    p1 = reference_probs(hf, PROMPT, [], params)
    out = torch.zeros(V, V, dtype=torch.float64)
    for x1 in torch.nonzero(p1).flatten().tolist():
        p2 = reference_probs(hf, PROMPT + [x1], [x1], params)
        for x2 in torch.nonzero(p2).flatten().tolist():
            out[x2] += p1[x1] * p2[x2] * reference_probs(hf, PROMPT + [x1, x2], [x1, x2], params)
    return out


def tree_engine(models, rule: str = "exact", branches: int = 3, **overrides) -> Engine:
    target, head, root = models
    table = {"pcg-singletons": "singletons.asg", "pcg": "groups.asg"}.get(rule)
    config = engine_config(target, draft=head, num_speculative_tokens=2, draft_branches=branches,
                           max_num_seqs=256, max_waiting=4096, kv_budget_tokens=256 * 16, block_size=4,
                           seed=7,                           acceptance="exact" if rule == "exact" else "pcg",
                           asg_table=None if table is None else root / table)
    return Engine(replace(config, **overrides))


@pytest.mark.parametrize("setting", ["topp", "penalty+constraint"])
@pytest.mark.parametrize("rule", ["exact", "pcg-singletons"])
def test_tree_decoding_has_the_target_distribution(models, setting, rule):
    params = replace(SETTINGS[setting], max_tokens=3)
    engine = tree_engine(models, rule)
    counts = torch.zeros(V, V, dtype=torch.long)
    for g in engine.generate([PROMPT] * 4000, params):
        counts[g.token_ids[1], g.token_ids[2]] += 1
    assert chi2_pvalue(counts, reference_second_and_third(models[0], params)) > ALPHA
    m = engine.metrics()
    assert m.spec_accepted_per_position[1] > 0  # branches' second drafts were accepted too


def test_candidates_raise_the_first_positions_acceptance(models):
    """Same requests, one chain against three candidates: the first position accepts more often with three
    (4000 rows each: a standard error of about 0.008 on each rate)."""
    params = replace(SETTINGS["topp"], max_tokens=3)
    rates = {}
    for k in (1, 3):
        engine = tree_engine(models, "exact", branches=k)
        engine.generate([PROMPT] * 4000, params)
        m = engine.metrics()
        rates[k] = m.spec_accepted_per_position[0] / m.spec_num_drafts
    assert rates[3] > rates[1] + 0.05, rates


@pytest.mark.parametrize("rule", ["exact", "pcg"])
def test_seeded_requests_reproduce_whatever_shares_the_batch(models, rule):
    engine = tree_engine(models, rule, max_num_seqs=16, max_waiting=64)
    params = SamplingParams(temperature=1.0, max_tokens=30, seed=1234)
    alone = engine.generate([PROMPT], params)[0]
    others = [SamplingParams(temperature=t, max_tokens=n) for t, n in ((0.3, 5), (1.0, 30), (0.7, 12))]
    crowd = engine.generate([[5, 6], PROMPT, [7, 7, 7], [1]], [others[0], params, others[1], others[2]])
    assert crowd[1].token_ids == alone.token_ids
    assert len(alone.token_ids) == 30 and alone.num_steps < 30  # it speculated
    other_seed = engine.generate([PROMPT], replace(params, seed=99))[0]
    assert other_seed.token_ids != alone.token_ids


def test_rows_of_rules_without_a_tree_form_verify_their_first_branch(models):
    """A block-verification row in a tree engine decodes the target's distribution from branch 0."""
    params = replace(SETTINGS["topp"], max_tokens=3)
    engine = tree_engine(models, "exact", acceptance="block")
    counts = torch.zeros(V, V, dtype=torch.long)
    for g in engine.generate([PROMPT] * 3000, params):
        counts[g.token_ids[1], g.token_ids[2]] += 1
    assert chi2_pvalue(counts, reference_second_and_third(models[0], params)) > ALPHA


def test_what_trees_do_not_run_on_is_refused(models):
    target, head, _ = models
    with pytest.raises(ValueError, match="feature-head"):
        Engine(engine_config(target, draft=save_tiny_llama(models[2] / "llama-draft", vocab=V, hidden=16,
                                                            heads=2, kv_heads=1, intermediate=32, layers=1,
                                                            seed=3),
                             draft_branches=2))
    with pytest.raises(ValueError, match="draft_confidence"):
        tree_engine(models, draft_confidence=0.3)
    with pytest.raises(ValueError, match="γ ≥ 2"):
        tree_engine(models, num_speculative_tokens=1)
    with pytest.raises(ValueError, match="positive integer"):
        tree_engine(models, draft_branches=0)
    for lengths in [(4,), (1,)]:  # a longer or a shorter second length: a tree drafts one
        with pytest.raises(ValueError, match="speculation_lengths"):
            tree_engine(models, speculation="auto", speculation_lengths=lengths)
    always = tree_engine(models, speculation="always", speculation_lengths=(4,))
    assert always.policy.max_length == 2  # the extra length ignored
