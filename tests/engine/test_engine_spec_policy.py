"""Load-aware speculation: the policy picks the draft length (0: target alone) measured faster per batch
size, and switching lengths between steps keeps outputs right (greedy + exact equals target-only decoding,
seeded requests keep the configured γ)."""

from __future__ import annotations

import pytest
from engine_support import engine_config, save_tiny_pair
from pcgtts.engine import Engine, SamplingParams
from pcgtts.engine.spec_policy import SpeculationPolicy


def drive(policy: SpeculationPolicy, batch: int, seconds: dict, tokens_per_seq, steps: int) -> list:
    """Run `steps` decisions at `batch`, each step taking seconds[mode] and emitting tokens_per_seq (or
    tokens_per_seq[γ]) tokens per sequence. Modes are True / False (speculate at the configured γ or not)
    where `seconds` has bool keys, else draft lengths."""
    by_flag = all(isinstance(k, bool) for k in seconds)
    choices = []
    for _ in range(steps):
        gamma = policy.draft_length(batch)
        mode = bool(gamma) if by_flag else gamma
        choices.append(mode)
        per_seq = tokens_per_seq.get(gamma, 1) if isinstance(tokens_per_seq, dict) else tokens_per_seq
        policy.record(batch, gamma, seconds[mode], round(batch * (per_seq if gamma else 1)))
    return choices


def test_policy_picks_the_faster_mode_per_batch_size_and_retries_the_other():
    policy = SpeculationPolicy(num_speculative_tokens=3, retry_every=10, trial_steps=2)
    # batch 1: a speculative step takes 1.5x a plain one and emits 2.4 tokens -> speculate
    small = drive(policy, 1, {True: 0.015, False: 0.010}, 2.4, 40)
    assert small[:4] == [True, True, False, False]  # each mode timed (trial_steps steps each)
    assert small[4:].count(True) > 28 and False in small[4:]  # mostly speculative, retried now and then
    # batch 12: a speculative step takes 3x a plain one -> target alone
    big = drive(policy, 12, {True: 0.090, False: 0.030}, 2.4, 40)
    assert big[4:].count(False) > 28 and True in big[4:]
    assert policy.rate(12, 0) > policy.rate(12, 3)
    # acceptance collapses: at batch 1 speculation stops paying too, once the window has seen it
    later = drive(policy, 1, {True: 0.015, False: 0.010}, 1.0, 120)
    # only trials speculate: one in 10 steps, three steps each (catch-up, then two timed)
    assert later[-20:].count(False) >= 14 and later[-20:].count(True) >= 3


def test_chance_dips_in_tokens_per_step_do_not_lock_speculation_out():
    """Tokens per speculative step vary 1..γ+1; at batch 1 with per-draft acceptance 0.66 (measured on the
    bundle) they average 2.38, and a speculative step costs 2.1x a plain one, so speculation pays 13%.
    An estimate that a few short steps can drag under 2.1 stops speculating and hears again only from
    retries (an exponential average of weight 0.2 speculated on 25% of 3,000 steps)."""
    import random

    rng = random.Random(0)

    def tokens() -> int:
        n = 1
        while n < 4 and rng.random() < 0.66:
            n += 1
        return n

    policy = SpeculationPolicy(num_speculative_tokens=3)
    speculated = 0
    for _ in range(3000):
        gamma = policy.draft_length(1)
        speculated += gamma > 0
        policy.record(1, gamma, 0.0096 if gamma else 0.00457, tokens() if gamma else 1)
    assert speculated / 3000 > 0.8
    assert abs(policy.tokens_per_seq() - 2.38) < 0.3


def test_always_and_no_draft():
    always = SpeculationPolicy(num_speculative_tokens=3, mode="always")
    assert all(drive(always, 8, {True: 9.0, False: 0.1}, 1.0, 5))
    assert not any(drive(SpeculationPolicy(num_speculative_tokens=0), 8, {True: 0.1, False: 9.0}, 1.0, 5))
    with pytest.raises(ValueError):
        SpeculationPolicy(num_speculative_tokens=3, mode="sometimes")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("policy"), seed=53)


def test_switching_modes_between_steps_keeps_greedy_exact_output_equal_to_target_only(pair):
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6][: 2 + i % 6] + [i] for i in range(10)]
    # top_k = 1: argmax decoding that is not `greedy` (a greedy or seeded request speculates on every step,
    # SamplingParams.reproducible), so the policy's plain steps reach it; fp32 products compute a row alike
    # in a plain step and a verify step (bf16 ones, at 16 rows, would not)
    params = SamplingParams(temperature=1.0, top_k=1, max_tokens=30)
    plain = Engine(engine_config(pair[0], block_size=4, cpu_weights="fp32"))
    reference = [g.token_ids for g in plain.generate(prompts, params)]
    auto = Engine(engine_config(pair[0], draft=pair[1], num_speculative_tokens=3, acceptance="exact",
                                block_size=4, speculation="auto", max_num_seqs=4, cpu_weights="fp32"))
    auto.policy.retry_every = 2  # switch modes often, so the draft keeps catching up after plain steps
    assert [g.token_ids for g in auto.generate(prompts, params)] == reference
    m = auto.metrics()
    assert m.speculative_steps > 3 and m.target_only_steps > 3
    assert m.spec_drafted_tokens == 3 * m.spec_num_drafts  # plain steps draft nothing


def test_the_draft_catch_up_step_after_target_only_steps_is_not_timed():
    policy = SpeculationPolicy(num_speculative_tokens=3, retry_every=5, trial_steps=2)
    drive(policy, 4, {True: 0.02, False: 0.01}, 1.2, 20)  # target-only wins; speculation is retried
    timed = list(policy._timing(4, 3).samples)
    # each retry after target-only steps runs two speculative steps; the first (catch-up) one is dropped,
    # so a catch-up costing 10x would not count against the mode either
    policy.record(4, 0, 0.04, 4)
    policy.record(4, 3, 10.0, 6)
    assert list(policy._timing(4, 3).samples) == timed


def test_policy_picks_the_draft_length_measured_fastest_per_batch_size():
    """Among target-only, γ 3 and γ 5: γ 5 emits more per step (3.6 against 3.0 tokens per sequence) and
    costs more; it wins where its step costs little more (batch 1), γ 3 where it costs a lot more (batch 8),
    target-only where every verify is dear (batch 32). Each length not chosen is still re-timed in turn."""
    policy = SpeculationPolicy(num_speculative_tokens=3, lengths=(5,), retry_every=10, trial_steps=2)
    assert policy.choices == (0, 3, 5) and policy.max_length == 5
    tokens = {3: 3.0, 5: 3.6}
    one = drive(policy, 1, {0: 0.010, 3: 0.016, 5: 0.017}, tokens, 80)
    assert one[:6] == [3, 3, 5, 5, 0, 0]  # the configured γ timed first, target-only last
    assert one[6:].count(5) > 55 and 3 in one[6:] and 0 in one[6:]
    eight = drive(policy, 8, {0: 0.010, 3: 0.020, 5: 0.030}, tokens, 80)
    assert eight[6:].count(3) > 55 and 5 in eight[6:] and 0 in eight[6:]
    big = drive(policy, 32, {0: 0.010, 3: 0.040, 5: 0.060}, tokens, 80)
    assert big[6:].count(0) > 55 and 3 in big[6:] and 5 in big[6:]
    assert policy.rate(1, 5) > policy.rate(1, 3) > policy.rate(1, 0)
    assert sum(policy.steps_by_length.values()) == 240


def test_a_length_far_behind_is_tried_less_and_less_often():
    """Target-only at a third of speculation's rate: its trials back off (each interval doubling, up to 8x),
    while a length within 10% of the chosen one keeps its regular trials."""
    policy = SpeculationPolicy(num_speculative_tokens=3, lengths=(5,), retry_every=10, trial_steps=2)
    steps = drive(policy, 1, {0: 0.010, 3: 0.010, 5: 0.0105}, {3: 3.0, 5: 3.0}, 1000)
    plain = [i for i, g in enumerate(steps) if g == 0]
    gaps = [b - a for a, b in zip(plain, plain[1:], strict=False) if b - a > 1]
    assert gaps[-1] >= 4 * gaps[0] and len(plain) < 40  # (without backing off: a trial every 20 steps)
    assert steps[6:].count(5) > 80  # γ 5 (5% behind) still has its trial of 2 steps every 20


def test_lengths_are_checked_and_always_runs_the_configured_gamma():
    with pytest.raises(ValueError):
        SpeculationPolicy(num_speculative_tokens=3, lengths=(0,))
    always = SpeculationPolicy(num_speculative_tokens=3, mode="always", lengths=(5,))
    assert set(drive(always, 1, {0: 0.1, 3: 0.1, 5: 0.001}, {3: 1.0, 5: 6.0}, 10)) == {3}
    assert SpeculationPolicy(num_speculative_tokens=0, lengths=(5,)).draft_length(1) == 0


def test_switching_draft_lengths_keeps_greedy_exact_output_equal_to_target_only(pair):
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6][: 2 + i % 6] + [i] for i in range(10)]
    params = SamplingParams(temperature=1.0, top_k=1, max_tokens=30)  # argmax, not `greedy` (see above)
    plain = Engine(engine_config(pair[0], block_size=4, cpu_weights="fp32"))
    reference = [g.token_ids for g in plain.generate(prompts, params)]
    auto = Engine(engine_config(pair[0], draft=pair[1], num_speculative_tokens=3, speculation_lengths=(2, 5),
                                acceptance="exact", block_size=4, speculation="auto", max_num_seqs=4,
                                cpu_weights="fp32"))
    auto.policy.retry_every = 2  # switch lengths often
    assert [g.token_ids for g in auto.generate(prompts, params)] == reference
    m = auto.metrics()
    by_length = auto.policy.steps_by_length
    assert all(by_length.get(g, 0) > 2 for g in (0, 2, 3, 5)), by_length
    assert len(m.spec_drafted_per_position) == 5
    # the 5th position is drafted only in γ-5 steps, the 3rd in γ-3 and γ-5 ones
    drafted = m.spec_drafted_per_position
    assert 0 < drafted[4] < drafted[2] < drafted[0]


def test_seeded_requests_keep_the_configured_gamma_whatever_length_the_policy_runs(pair):
    """A seeded request's tokens depend on the γ of its steps (its generator gives γ draws to the draft
    per step): under "auto" with a longer length on offer it still decodes what "always" at the configured
    γ decodes, while its unseeded batch mates run the policy's length."""
    prompts = [[3, 1, 4, 1, 5, 9][: 2 + i % 5] + [i] for i in range(4)]
    seeded = SamplingParams(temperature=1.0, seed=11, max_tokens=24)
    unseeded = SamplingParams(temperature=1.0, max_tokens=24)
    common = dict(draft=pair[1], num_speculative_tokens=3, acceptance="exact", block_size=4, max_num_seqs=4,
                  cpu_weights="fp32")
    always = Engine(engine_config(pair[0], speculation="always", **common))
    expected = always.generate(prompts[:1], seeded)[0].token_ids
    auto = Engine(engine_config(pair[0], speculation="auto", speculation_lengths=(5,), **common))
    auto.policy.draft_length = lambda batch: 5  # the policy's choice, every step
    outs = auto.generate(prompts, [seeded] + [unseeded] * 3)
    assert outs[0].token_ids == expected
    drafted = auto.metrics().spec_drafted_per_position
    assert drafted[4] > 0 and drafted[0] > drafted[4]  # unseeded rows drafted 5, the seeded one 3


def test_speculation_lengths_are_validated(pair):
    with pytest.raises(ValueError, match="positive integers"):
        Engine(engine_config(pair[0], draft=pair[1], speculation="auto", speculation_lengths=(0,)))
