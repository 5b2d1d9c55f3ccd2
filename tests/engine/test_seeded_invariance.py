"""A seeded request gives the same tokens alone and beside any mix of other requests (README: the seed
promise), with the embedded model: the feature-head draft, the 1-layer Llama draft and the target alone.

The crowd varies everything a batch mate can: text length, temperature (greedy included), top-k, top-p,
repetition penalty, acceptance rule, γ, seeded or not, joining and leaving (and aborted) at different
steps; a tight KV budget preempts and recomputes, a small prefill budget chunks prompts, and shared voices
hit the prefix cache. Beyond the tokens, every logits row the request's constraint was handed (each draft
and verify position) must be the same bits: a rounding difference that has not yet flipped a token fails
the test too."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from pcgtts.engine import Engine, EngineConfig, SamplingParams
from pcgtts.engine.sequence import Status
from pcgtts.engine.speech.demo.constraint import MarkerMergeConstraint
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle

BUNDLE = ModelBundle.from_dir(DEFAULT_MODEL_DIR)
FAMILY = BUNDLE.load_family()
PROBE_TEXT = "The little boat drifted slowly towards the shore while the gulls cried overhead."
TEXTS = ["Yes.", "Please bring the blue folder tomorrow morning.", "A quiet voice answered from the hall.",
         "We met at noon and walked to the market to buy apples, bread, cheese and a bunch of flowers.",
         "Stop!", "Seven silver swans swam silently seaward.", "How far is it to the old mill by the river?"]
KINDS = {"feature-head": BUNDLE.draft_dir, "llama-draft": DEFAULT_MODEL_DIR / "draft", "target-only": None}


class Recorded(MarkerMergeConstraint):
    """The request's own constraint, keeping a copy of every logits row the engine hands it."""

    seen: list[torch.Tensor]

    @classmethod
    def apply_rows(cls, constraints, logits, histories, ops=None):
        for constraint, rows in zip(constraints, logits, strict=True):
            constraint.seen.append(rows.clone())
        return super().apply_rows(constraints, logits, histories, ops)


def probe_request(greedy: bool = False) -> tuple[list[int], SamplingParams]:
    """The request under test: seeded sampling, or greedy with no seed (held to the same promise)."""
    prompt = FAMILY.build_prompt(PROBE_TEXT, FAMILY.voices["aria"])
    constraint = copy.copy(prompt.constraint)
    constraint.__class__, constraint.seen = Recorded, []
    sampling = dict(temperature=0.0) if greedy else dict(temperature=0.8, seed=33)
    return prompt.token_ids, SamplingParams(**sampling, max_tokens=600, constraint=constraint,
                                           stop_token_ids=prompt.stop_token_ids)


def crowd(speculative: bool, n: int = 14) -> list[tuple[list[int], SamplingParams, int, int | None]]:
    """(prompt, params, step it joins at, step it is aborted at or None) for n varied requests."""
    rng = random.Random(7)
    voices = sorted(FAMILY.voices)
    out = []
    for i in range(n):
        prompt = FAMILY.build_prompt(TEXTS[i % len(TEXTS)], FAMILY.voices[voices[i % 3]])  # shared voices
        kw = dict(temperature=rng.choice([0.0, 0.5, 0.8, 1.3]), max_tokens=rng.choice([15, 80, 250, 600]),
                  stop_token_ids=prompt.stop_token_ids, constraint=prompt.constraint,
                  seed=rng.choice([None, 1000 + i]))
        if i % 4 == 1:
            kw["top_k"] = rng.choice([5, 40])
        if i % 4 == 2:
            kw["top_p"] = rng.choice([0.7, 0.95])
        if i % 5 == 3:
            kw["repetition_penalty"] = 1.2
        if speculative:
            kw["acceptance"] = rng.choice([None, "exact", "ssd", "topk", "lantern"])
            if i % 8 in (3, 4):  # the block rules too, drawing nothing more from rng (the same schedule)
                kw["acceptance"] = "block" if i % 8 == 3 else "pcg-block"
            kw["num_speculative_tokens"] = rng.choice([None, 1, 2])
        abort = rng.randrange(5, 60) if i % 6 == 5 else None
        out.append((prompt.token_ids, SamplingParams(**kw), rng.randrange(0, 40), abort))
    return out


def make_engine(kind: str, deterministic: str = "seeded") -> Engine:
    draft = KINDS[kind]
    return Engine(EngineConfig(
        target=BUNDLE.target_dir, draft=draft, num_speculative_tokens=3 if draft else 0, acceptance="pcg",
        asg_table=BUNDLE.asg_table, extra_asg_tables=BUNDLE.extra_asg_tables, deterministic=deterministic,
        max_num_seqs=8, kv_budget_tokens=700, max_num_batched_tokens=160))


def run_alone(engine: Engine, greedy: bool = False) -> tuple[list[int], list[torch.Tensor]]:
    prompt, params = probe_request(greedy)
    return engine.generate([prompt], params)[0].token_ids, params.constraint.seen


def run_in_crowd(engine: Engine, probe_joins: int,
                 greedy: bool = False) -> tuple[list[int], list[torch.Tensor], int]:
    """(the probe's tokens, its logits rows, how often it was preempted)."""
    prompt, params = probe_request(greedy)
    others = crowd(engine.num_speculative_tokens > 0)
    ids: dict[int, str] = {}
    probe, tokens, step, preempted = None, [], 0, 0
    while step == 0 or engine.has_unfinished() or len(ids) < len(others) or probe is None:
        if step == probe_joins:
            probe = engine.requests[engine.add_request(prompt, params)]
        for i, (p, sp, joins, abort) in enumerate(others):
            if joins == step:
                ids[i] = engine.add_request(p, sp)
            if abort == step and i in ids:
                engine.abort(ids[i])
        was_running = probe is not None and probe.status is Status.RUNNING
        for out in engine.step():
            if probe is not None and out.request_id == probe.request_id:
                tokens += out.token_ids
        preempted += was_running and probe.status is Status.WAITING
        step += 1
    return tokens, params.constraint.seen, preempted


# greedy without a seed is held to the same promise: with PCG, whether a step speculates changes its tokens
# (a draft in the target's group is accepted), and PCG draws group labels even at temperature 0
@pytest.mark.parametrize("kind,greedy", [(kind, False) for kind in KINDS] + [("feature-head", True)])
def test_a_seeded_request_is_the_same_alone_and_in_any_crowd(kind, greedy):
    engine = make_engine(kind)
    assert engine.invariance.active
    alone, alone_logits = run_alone(engine, greedy)
    assert len(alone) > 150
    before, preempted = engine.metrics(), 0
    for joins in (0, 24):
        tokens, logits, times = run_in_crowd(engine, joins, greedy)
        assert tokens == alone, f"joining at step {joins}"
        assert len(logits) == len(alone_logits)
        assert all(torch.equal(a, b) for a, b in zip(logits, alone_logits, strict=True)), joins
        preempted += times
    assert preempted > 0  # the request itself was preempted and recomputed
    assert engine.metrics().prefix_cache_hits > before.prefix_cache_hits
    assert engine.kv_blocks_in_use() == (0, 0)


def test_without_batch_invariant_forwards_the_crowd_changes_the_numbers():
    """The comparison above has teeth: with deterministic='off' the same request's logits round
    differently in the crowd (its tokens may or may not have flipped yet)."""
    engine = make_engine("feature-head", deterministic="off")
    _, alone_logits = run_alone(engine)
    _, logits, _ = run_in_crowd(engine, 0)
    n = min(len(logits), len(alone_logits))
    assert not all(torch.equal(a, b) for a, b in zip(logits[:n], alone_logits[:n], strict=True))
