"""Load-aware speculation: the policy picks the mode measured faster per batch size, and switching
modes between steps keeps outputs right (greedy + exact equals target-only decoding)."""

from __future__ import annotations

import pytest
from engine_support import engine_config, save_tiny_pair
from pcgtts.engine import Engine, SamplingParams
from pcgtts.engine.spec_policy import SpeculationPolicy


def drive(policy: SpeculationPolicy, batch: int, seconds: dict[bool, float], tokens_per_seq: float,
          steps: int) -> list[bool]:
    """Run `steps` decisions at `batch`, each step taking seconds[mode] and emitting the given tokens."""
    choices = []
    for _ in range(steps):
        spec = policy.speculate(batch)
        choices.append(spec)
        policy.record(batch, spec, seconds[spec], round(batch * (tokens_per_seq if spec else 1)))
    return choices


def test_policy_picks_the_faster_mode_per_batch_size_and_retries_the_other():
    policy = SpeculationPolicy(num_speculative_tokens=3, retry_every=10)
    # batch 1: a speculative step takes 1.5x a plain one and emits 2.4 tokens -> speculate
    small = drive(policy, 1, {True: 0.015, False: 0.010}, 2.4, 40)
    assert small[:2] == [True, False]  # each mode timed once
    assert small[2:].count(True) > 30 and False in small[2:]  # mostly speculative, retried now and then
    # batch 12: a speculative step takes 3x a plain one -> target alone
    big = drive(policy, 12, {True: 0.090, False: 0.030}, 2.4, 40)
    assert big[2:].count(False) > 30 and True in big[2:]
    assert policy.rate(12, False) > policy.rate(12, True)
    # acceptance collapses: at batch 1 speculation stops paying too, once the window has seen it
    later = drive(policy, 1, {True: 0.015, False: 0.010}, 1.0, 120)
    assert later[-20:].count(False) >= 16  # retries: two speculative steps (catch-up, then timed)


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
        spec = policy.speculate(1)
        speculated += spec
        policy.record(1, spec, 0.0096 if spec else 0.00457, tokens() if spec else 1)
    assert speculated / 3000 > 0.8
    assert abs(policy.tokens_per_seq - 2.38) < 0.3


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
    policy = SpeculationPolicy(num_speculative_tokens=3, retry_every=5)
    drive(policy, 4, {True: 0.02, False: 0.01}, 1.2, 12)  # target-only wins; speculation is retried
    timed = list(policy._timing(4, True).samples)
    # each retry after target-only steps runs two speculative steps; the first (catch-up) one is dropped,
    # so a catch-up costing 10x would not count against the mode either
    policy.record(4, False, 0.04, 4)
    policy.record(4, True, 10.0, 6)
    assert list(policy._timing(4, True).samples) == timed
