"""Sampled speculative decoding has the target's distribution (after penalty, constraint and warping).

The reference distribution is computed independently: transformers' model, its logits processors
(repetition penalty, temperature, top-k, top-p) and the constraint, position by position.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from engine_support import engine_config, hf_model, save_draft_from, save_feature_head, save_tiny_llama
from pcgtts.engine import Engine, SamplingParams
from pcgtts.engine.draft_length import confident_lengths, still_drafting
from pcgtts.engine.speech.base import DecodeConstraint
from scipy.stats import chisquare

V = 12
GROUP = [8, 9, 10]  # "markers": the constraint moves their joint mass onto one of them
PROMPT = [1, 2, 3, 8]
ALPHA = 1e-3


class MergeOnto(DecodeConstraint):
    """All mass of GROUP goes to GROUP[len(history) % 3]: history-dependent, like the phoneme-marker merge."""

    def apply(self, logits, histories):
        out = logits.clone()
        for i, history in enumerate(histories):
            merged = torch.logsumexp(logits[i, GROUP], dim=0)
            out[i, GROUP] = float("-inf")
            out[i, GROUP[len(history) % len(GROUP)]] = merged
        return out


SETTINGS = {
    "penalty+constraint+topk": SamplingParams(temperature=0.8, top_k=7, repetition_penalty=1.5, max_tokens=2,
                                              constraint=MergeOnto()),
    "topp": SamplingParams(temperature=1.3, top_p=0.8, max_tokens=2),
    # temperature only: softmax and draw run as one op (engine/ops/softmax_draw.py)
    "penalty+constraint": SamplingParams(temperature=0.9, repetition_penalty=1.5, max_tokens=2,
                                         constraint=MergeOnto()),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("sampling")
    target = save_tiny_llama(root / "target", vocab=V, hidden=32, heads=2, kv_heads=1, intermediate=64,
                             layers=2, seed=21, init_std=0.3)
    draft = save_draft_from(target, root / "draft", layers=2, noise=0.5)
    return target, draft


def reference_probs(hf, tokens: list[int], generated: list[int], params: SamplingParams) -> torch.Tensor:
    from transformers import (
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    ids = torch.tensor([tokens])
    with torch.no_grad():
        scores = hf(ids).logits[:, -1].float()
    if params.repetition_penalty != 1:
        scores = RepetitionPenaltyLogitsProcessor(params.repetition_penalty)(ids, scores)
    if params.constraint is not None:
        scores = params.constraint.apply(scores, [generated])
    scores = TemperatureLogitsWarper(params.temperature)(ids, scores)
    if params.top_k:
        scores = TopKLogitsWarper(params.top_k)(ids, scores)
    if params.top_p < 1:
        scores = TopPLogitsWarper(params.top_p)(ids, scores)
    return torch.softmax(scores, dim=-1)[0].double()


def reference_joint(target_dir, params: SamplingParams) -> torch.Tensor:
    """P(x1, x2) [V, V] of the processed target."""
    hf = hf_model(target_dir)
    p1 = reference_probs(hf, PROMPT, [], params)
    joint = torch.zeros(V, V, dtype=torch.float64)
    for x1 in range(V):
        if p1[x1] > 0:
            joint[x1] = p1[x1] * reference_probs(hf, PROMPT + [x1], [x1], params)
    return joint


def chi2_pvalue(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson chi-square of counts against probabilities, cells with expected < 5 pooled."""
    n = counts.sum()
    expected = expected_probs.flatten() * n
    counts = counts.flatten().double()
    assert counts[expected == 0].sum() == 0, "a token the target rules out was emitted"
    obs, exp = pooled_cells(counts, expected)
    return float(chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue)


def pooled_cells(observed: torch.Tensor, expected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Observed and expected counts (Float[C] each) with the cells expecting fewer than 5 pooled into one
    last cell, dropped when it expects nothing."""
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return obs, exp


def empirical_joint(engine: Engine, params: SamplingParams, n: int) -> torch.Tensor:
    counts = torch.zeros(V, V, dtype=torch.long)
    for g in engine.generate([PROMPT] * n, params):
        counts[g.token_ids[0], g.token_ids[1]] += 1
    return counts


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("rule", ["exact", "pcg-singletons", "block"])
def test_speculative_sampling_has_target_distribution(models, tmp_path, setting, rule):
    target, draft = models
    params = SETTINGS[setting]
    config = engine_config(target, draft=draft, num_speculative_tokens=2, max_num_seqs=256,
                          max_waiting=4096, kv_budget_tokens=256 * 16, block_size=4, seed=7,
                          acceptance="block" if rule == "block" else "exact")
    if rule == "pcg-singletons":
        from pcgtts.asg_tables import ASGTable

        ASGTable.from_groups([], V).save(tmp_path / "singletons.asg")
        config.acceptance, config.asg_table = "pcg", tmp_path / "singletons.asg"
    engine = Engine(config)
    counts = empirical_joint(engine, params, n=3000)
    expected = reference_joint(target, params)
    assert chi2_pvalue(counts, expected) > ALPHA
    m = engine.metrics()
    assert 0.2 < m.spec_accepted_tokens / m.spec_drafted_tokens < 0.95  # rejections were resampled


@pytest.mark.parametrize("setting", ["penalty+constraint+topk", "penalty+constraint"])
def test_target_only_sampling_has_target_distribution(models, setting):
    params = SETTINGS[setting]
    engine = Engine(engine_config(models[0], max_num_seqs=256, max_waiting=4096, seed=3))
    assert chi2_pvalue(empirical_joint(engine, params, n=2000), reference_joint(models[0], params)) > ALPHA


def test_pcg_singletons_equal_exact_when_greedy(models, tmp_path):
    from pcgtts.asg_tables import ASGTable

    ASGTable.from_groups([], V).save(tmp_path / "singletons.asg")
    prompts = [[t % V for t in range(s, s + 3 + s % 5)] for s in range(12)]
    params = SamplingParams(temperature=0, max_tokens=16, constraint=MergeOnto(), repetition_penalty=1.2)
    outs = {}
    for rule in ("exact", "pcg"):
        engine = Engine(engine_config(models[0], draft=models[1], acceptance=rule,
                                     asg_table=tmp_path / "singletons.asg", num_speculative_tokens=3))
        outs[rule] = [g.token_ids for g in engine.generate(prompts, params)]
    target_only = Engine(engine_config(models[0]))
    assert outs["exact"] == outs["pcg"] == [g.token_ids for g in target_only.generate(prompts, params)]
    # per-request rule override: one batch, half verified by the engine's pcg, half by exact
    mixed = [replace(params, acceptance="exact" if i % 2 else None) for i in range(len(prompts))]
    assert [g.token_ids for g in engine.generate(prompts, mixed)] == outs["exact"]
    assert sorted(engine.rules.built()) == [("exact", None), ("pcg", "singletons")]  # default table by name


@pytest.mark.parametrize("token_rule,group_rule", [("exact", "pcg"), ("block", "pcg-block")])
def test_pcg_singletons_equal_exact_under_the_same_seed(models, tmp_path, token_rule, group_rule):
    """Sampled (T > 0): with group k = {k}, PCG replays exact's random draws (pcg-block block's), so seeded
    outputs match."""
    from pcgtts.asg_tables import ASGTable

    ASGTable.from_groups([], V).save(tmp_path / "singletons.asg")
    prompts = [[t % V for t in range(s, s + 3 + s % 5)] for s in range(8)]
    params = [SamplingParams(temperature=0.9, top_p=0.95, max_tokens=24, seed=100 + i, constraint=MergeOnto())
              for i in range(len(prompts))]
    outs, drafted = {}, {}
    for rule in (token_rule, group_rule):
        engine = Engine(engine_config(models[0], draft=models[1], acceptance=rule,
                                     asg_table=tmp_path / "singletons.asg", num_speculative_tokens=3))
        gens = engine.generate(prompts, params)
        outs[rule] = [g.token_ids for g in gens]
        drafted[rule] = [(g.num_drafted, g.num_accepted) for g in gens]
    assert outs[group_rule] == outs[token_rule]
    assert drafted[group_rule] == drafted[token_rule]
    assert 0 < sum(a for _, a in drafted[token_rule]) < sum(d for d, _ in drafted[token_rule])  # both ran


@pytest.mark.parametrize("kind,rule", [("llama", "exact"), ("feature-head", "exact"), ("llama", "block"),
                                       ("llama", "pcg-block")])
def test_seeded_requests_reproduce_whatever_shares_the_batch(models, tmp_path, kind, rule):
    """With either draft: a head row's first step is target-only whatever shares the batch, too. The block
    rules' verifies draw per row as the token-level ones do (`row_draws`)."""
    from pcgtts.asg_tables import ASGTable

    draft = models[1] if kind == "llama" else save_feature_head(models[0], tmp_path / "head")
    ASGTable.from_groups([GROUP, [1, 2]], V).save(tmp_path / "groups.asg")
    engine = Engine(engine_config(models[0], draft=draft, num_speculative_tokens=3, seed=1, acceptance=rule,
                                  asg_table=tmp_path / "groups.asg"))
    params = SamplingParams(temperature=1.0, max_tokens=30, seed=1234)
    alone = engine.generate([PROMPT], params)[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=n) for n in (5, 30, 12)]
    crowd = engine.generate([[5, 6], PROMPT, [7, 7, 7], [1]], [others[0], params, others[1], others[2]])
    assert crowd[1].token_ids == alone
    assert len(alone) == 30
    other_seed = engine.generate([PROMPT], SamplingParams(temperature=1.0, max_tokens=30, seed=99))[0]
    assert other_seed.token_ids != alone


def test_per_request_gamma_keeps_target_distribution(models):
    """Rows asking for γ=1 in a γ=3 engine verify one draft per step and still sample the target."""
    target, draft = models
    params = replace(SETTINGS["topp"], num_speculative_tokens=1)
    engine = Engine(engine_config(target, draft=draft, num_speculative_tokens=3, max_num_seqs=256,
                                  max_waiting=4096, kv_budget_tokens=256 * 16, block_size=4, seed=11))
    counts = empirical_joint(engine, params, n=3000)
    assert chi2_pvalue(counts, reference_joint(target, params)) > ALPHA
    m = engine.metrics()
    assert m.spec_drafted_tokens == m.spec_num_drafts > 0  # one draft verified per row per step
    assert m.spec_accepted_per_position[1:] == [0, 0]
    with pytest.raises(ValueError, match="exceeds"):
        engine.generate([PROMPT], replace(params, num_speculative_tokens=4))


def test_per_request_asg_table(models, tmp_path):
    """A request picks one of the engine's ASG tables by name: one group over the whole vocabulary accepts
    every draft (P_c = Q_c = 1), singletons only as often as exact does."""
    from pcgtts.asg_tables import ASGTable

    target, draft = models
    ASGTable.from_groups([], V).save(tmp_path / "singletons.asg")
    ASGTable.from_groups([list(range(V))], V).save(tmp_path / "everything.asg")
    engine = Engine(engine_config(target, draft=draft, num_speculative_tokens=2, acceptance="pcg",
                                  asg_table=tmp_path / "singletons.asg", max_num_seqs=64,
                                  extra_asg_tables={"everything": tmp_path / "everything.asg"}))
    assert list(engine.asg_table_paths) == ["singletons", "everything"]
    rate = {}
    for table in ("singletons", "everything"):
        out = engine.generate([PROMPT] * 64, replace(SETTINGS["topp"], max_tokens=8, asg_table=table))
        rate[table] = sum(g.num_accepted for g in out) / sum(g.num_drafted for g in out)
    assert rate["everything"] == 1.0 and rate["singletons"] < 0.95
    with pytest.raises(ValueError, match="no ASG table named"):
        engine.generate([PROMPT], replace(SETTINGS["topp"], asg_table="missing"))


@pytest.mark.parametrize("vocab", [1200, 20_000], ids=["compiled-draws", "torch-draws"])
def test_a_rows_probabilities_and_draws_do_not_depend_on_its_batch_mates_settings(vocab):
    """A plain temperature row (the seeded request) gets the same draft probabilities, draw and verify
    probabilities alone and beside rows with top-k, top-p, greedy or a repetition penalty. A batch-wide
    switch used to send it through other ops than alone (the compiled softmax-and-draw loop or the torch
    ops, which round differently), and a top-p batch mate used to cut its far tail, where the cumulative
    sum rounds up to 1 before the last token."""
    from pcgtts.engine.ops import Ops
    from pcgtts.engine.sampling import BatchSampler
    from pcgtts.engine.sequence import Sequence

    gen = torch.Generator().manual_seed(9)
    logits = 3 * torch.randn(5, 4, vocab, generator=gen)
    logits[:, :, vocab // 2:] -= 40  # a far tail of tiny probabilities
    drafts = torch.randint(0, vocab, (5, 3), generator=gen)
    probe = SamplingParams(temperature=0.8, seed=5)
    mates = [SamplingParams(temperature=0.7, top_k=5), SamplingParams(temperature=1.1, top_p=0.9),
             SamplingParams(temperature=0), SamplingParams(temperature=0.9, repetition_penalty=1.3)]

    def run(params: list[SamplingParams], rows: list[int], place: int):
        seqs = [Sequence(request_id=str(i), prompt_len=3, token_ids=[1, 2, 3], params=p, arrival=i,
                         generator=torch.Generator().manual_seed(100 + rows[i] if p.seed is None else p.seed))
                for i, p in enumerate(params)]
        sampler = BatchSampler(seqs, vocab, torch.device("cpu"), torch.Generator().manual_seed(0),
                               Ops.choose("cpu", vocab))
        draft_probs, token = sampler.probs_and_draw(logits[rows, :1], drafts[rows], offset=0)
        verify = sampler.probs(logits[rows], drafts[rows], offset=0)
        return draft_probs[place], token[place], verify[place]

    alone = run([probe], [0], 0)
    for place in (0, 2, 4):
        params = mates[:place] + [probe] + mates[place:]
        rows = list(range(1, place + 1)) + [0] + list(range(place + 1, 5))
        got = run(params, rows, place)
        assert all(torch.equal(a, b) for a, b in zip(got, alone, strict=True)), place
    assert bool((alone[2][:, vocab // 2:] > 0).any())  # the tail is there to be cut


def test_confident_lengths_stop_at_the_first_unsure_position():
    """confidence[:, j]: the draft's top probability at position j+1; the first position is always verified,
    each later one only while every position from the second on is sure."""
    confidence = torch.tensor([[0.9, 0.9, 0.9, 0.9], [0.9, 0.2, 0.9, 0.9], [0.1, 0.9, 0.9, 0.9],
                               [0.9, 0.9, 0.9, 0.9], [0.9, 0.9, 0.3, 0.9]])
    caps = torch.tensor([4, 4, 4, 2, 4])
    assert confident_lengths(confidence, caps, 0.5).tolist() == [4, 1, 4, 2, 2]
    assert confident_lengths(confidence, caps, 0.0).tolist() == [4, 4, 4, 2, 4]  # θ = 0: every row its γ
    # drafting stopped after position 2
    assert confident_lengths(confidence[:, :2], caps, 0.5).tolist() == [2, 1, 2, 2, 2]
    assert still_drafting(confidence[:, :2], caps, 0.5)  # rows 0, 2 and 4 go on
    assert not still_drafting(confidence[1:2, :2], caps[1:2], 0.5)  # unsure at position 2
    assert not still_drafting(confidence[3:4, :2], caps[3:4], 0.0)  # at its cap
    assert not still_drafting(confidence[4:, :3], caps[4:], 0.5)  # unsure at position 3


@pytest.mark.parametrize("kind", ["llama", "feature-head"])
@pytest.mark.parametrize("setting", ["topp", "penalty+constraint"])
def test_confidence_following_draft_length_keeps_target_distribution(models, tmp_path, kind, setting):
    """Rows stop drafting where the draft is unsure (θ near the median confidence, so lengths 1..γ all
    occur); the emitted tokens still follow the target."""
    target = models[0]
    draft = models[1] if kind == "llama" else save_feature_head(target, tmp_path / "head")
    params = SETTINGS[setting]
    engine = Engine(engine_config(target, draft=draft, num_speculative_tokens=3, draft_confidence=0.3,
                                  max_num_seqs=256, max_waiting=4096, kv_budget_tokens=256 * 16, block_size=4,
                                  seed=13))
    counts = empirical_joint(engine, replace(params, max_tokens=3), n=3000)
    assert chi2_pvalue(counts, reference_joint(target, params)) > ALPHA
    m = engine.metrics()
    assert m.spec_num_drafts < m.spec_drafted_tokens < 3 * m.spec_num_drafts  # lengths vary between 1 and γ
    assert m.spec_drafted_per_position[0] == m.spec_num_drafts > m.spec_drafted_per_position[2] > 0
    assert sum(m.spec_drafted_per_position) == m.spec_drafted_tokens
    assert m.spec_accepted_per_position[2] > 0


PARTITION = [[0, 1, 2], [3, 4], [5, 6, 7], [8, 9], [10, 11]]  # ASG groups that cover each token once
GROUP_OF = torch.tensor([next(i for i, g in enumerate(PARTITION) if t in g) for t in range(V)])  # Long[V]


def conditional_groups_pvalue(pairs: torch.Tensor, expected: torch.Tensor, min_count: int = 50) -> float:
    """Pearson chi-square of the second token's group given the first, against expected [V, M] (row x1: the
    groups' probabilities given x1), over the x1 seen at least min_count times; within a row, groups
    expecting fewer than 5 are pooled. Degrees of freedom: the rows' cells less one each."""
    from scipy.stats import chi2

    statistic, dof = 0.0, 0
    for x1 in range(V):
        seconds = pairs[pairs[:, 0] == x1, 1]
        if len(seconds) < min_count:
            continue
        observed = torch.bincount(GROUP_OF[seconds], minlength=len(PARTITION)).double()
        want = expected[x1] * len(seconds)
        assert observed[want == 0].sum() == 0, "a group the target rules out was emitted"
        obs, exp = pooled_cells(observed, want)
        statistic += float(((obs - exp) ** 2 / exp).sum())
        dof += len(obs) - 1
    assert dof > 10, "too few first tokens seen often enough"
    return float(chi2.sf(statistic, dof))


@pytest.mark.parametrize("setting", ["topp", "penalty+constraint"])
def test_confidence_following_draft_length_keeps_pcgs_group_distribution(models, tmp_path, setting):
    """PCG with rows that stop drafting where the draft is unsure: given the first emitted token (position 1,
    always verified), the second one's group (position 2, verified only when the draft was sure there, else
    the target's bonus) follows the target's coarse distribution Q_c; the table is a partition, so a token's
    group is its label."""
    from pcgtts.asg_tables import ASGTable

    target, draft = models
    params = SETTINGS[setting]
    ASGTable.from_groups(PARTITION, V).save(tmp_path / "partition.asg")
    engine = Engine(engine_config(target, draft=draft, num_speculative_tokens=3, draft_confidence=0.3,
                                  acceptance="pcg", asg_table=tmp_path / "partition.asg", max_num_seqs=256,
                                  max_waiting=4096, kv_budget_tokens=256 * 16, block_size=4, seed=17))
    pairs = torch.tensor([g.token_ids[:2] for g in engine.generate([PROMPT] * 4000, params)])
    # q(x2 | x1) for every x1, those the target rules out included: PCG may emit any member of a group it
    # accepts, whatever the target's probability of that token
    hf = hf_model(target)
    following = torch.stack([reference_probs(hf, PROMPT + [x1], [x1], params) for x1 in range(V)])  # [V, V]
    coarse = torch.zeros(V, len(PARTITION), dtype=torch.float64).index_add_(1, GROUP_OF, following)  # [V, M]
    assert conditional_groups_pvalue(pairs, coarse) > ALPHA
    first = reference_probs(hf, PROMPT, [], params)
    after_prompt = torch.zeros(len(PARTITION), dtype=torch.float64).index_add_(0, GROUP_OF, first)
    first_groups = torch.bincount(GROUP_OF[pairs[:, 0]], minlength=len(PARTITION))
    assert chi2_pvalue(first_groups, after_prompt) > ALPHA  # position 1's group: Q_c after the prompt
    m = engine.metrics()
    assert m.spec_num_drafts < m.spec_drafted_tokens < 3 * m.spec_num_drafts  # lengths vary between 1 and γ
    assert 0 < m.spec_drafted_per_position[1] < m.spec_num_drafts  # position 2 verified on some rows only


@pytest.mark.parametrize("kind", ["llama", "feature-head"])
def test_confidence_following_draft_length_reproduces_seeded_requests_whatever_shares_the_batch(
        models, tmp_path, kind):
    """How far the batch drafts depends on every row's confidence; a seeded row's tokens do not."""
    draft = models[1] if kind == "llama" else save_feature_head(models[0], tmp_path / "head")
    engine = Engine(engine_config(models[0], draft=draft, num_speculative_tokens=4, draft_confidence=0.4,
                                  seed=1))
    params = SamplingParams(temperature=1.0, max_tokens=30, seed=1234)
    alone = engine.generate([PROMPT], params)[0]
    others = [SamplingParams(temperature=t, max_tokens=n) for t, n in ((0.3, 5), (1.0, 30), (0.2, 12))]
    crowd = engine.generate([[5, 6], PROMPT, [7, 7, 7], [1]], [others[0], params, others[1], others[2]])
    assert crowd[1].token_ids == alone.token_ids
    assert alone.num_steps < len(alone.token_ids)  # it speculated


def test_draft_confidence_outside_zero_one_is_refused(models):
    with pytest.raises(ValueError, match="draft_confidence"):
        Engine(engine_config(models[0], draft=models[1], draft_confidence=1.5))
