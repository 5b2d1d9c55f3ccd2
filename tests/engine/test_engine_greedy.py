"""Greedy decoding: the engine equals transformers; speculative `exact` equals target-only token for token."""

from __future__ import annotations

import pytest
import torch
from engine_support import engine_config, hf_model, save_draft_from, save_tiny_llama
from pcgtts.engine import Engine, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=24)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("greedy")
    target = save_tiny_llama(root / "target", vocab=512, layers=3, seed=11)
    # target + 5% noise: the draft agrees ~60% of the time, so rounds mix acceptances and rejections
    draft = save_draft_from(target, root / "draft", layers=3, noise=0.05)
    return target, draft


def mixed_prompts(n: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 40, (n,), generator=gen).tolist()
    return [torch.randint(0, 512, (k,), generator=gen).tolist() for k in lengths]


@pytest.fixture(scope="module")
def target_only(pair):
    return Engine(engine_config(pair[0], block_size=8))


def test_target_only_equals_transformers_generate(pair, target_only):
    hf = hf_model(pair[0])
    prompts = mixed_prompts(6, seed=1)
    got = target_only.generate(prompts, GREEDY)
    for prompt, gen in zip(prompts, got, strict=True):
        ref = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=GREEDY.max_tokens, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(prompt):].tolist()
        assert gen.token_ids == ref
        assert gen.finish_reason == "length" and gen.num_drafted == 0


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_speculative_exact_equals_target_only(pair, target_only, gamma):
    prompts = mixed_prompts(10, seed=2)
    expected = [g.token_ids for g in target_only.generate(prompts, GREEDY)]
    spec = Engine(engine_config(pair[0], draft=pair[1], acceptance="exact",
                               num_speculative_tokens=gamma, block_size=8))
    got = spec.generate(prompts, GREEDY)
    assert [g.token_ids for g in got] == expected
    m = spec.metrics()
    rate = m.spec_accepted_tokens / m.spec_drafted_tokens
    assert 0.1 < rate < 0.95, rate  # both branches of verification were exercised
    assert m.spec_drafted_tokens == sum(g.num_drafted for g in got) == gamma * m.batch_tokens
    assert m.spec_accepted_tokens == sum(g.num_accepted for g in got)
    assert m.spec_accepted_per_position[0] >= m.spec_accepted_per_position[-1]
    assert spec.kv_blocks_in_use() == (0, 0)


def test_stop_tokens_and_limits(pair, target_only):
    prompt = mixed_prompts(1, seed=3)[0]
    free = target_only.generate([prompt], GREEDY)[0].token_ids
    stop = free[7]
    first = free.index(stop)
    spec = Engine(engine_config(pair[0], draft=pair[1], num_speculative_tokens=4))
    for engine in (target_only, spec):
        stopping = SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[stop])
        out = engine.generate([prompt], stopping)[0]
        assert out.token_ids == free[:first + 1] and out.finish_reason == "stop"
        out = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=5))[0]
        assert out.token_ids == free[:5] and out.finish_reason == "length"


def test_continuous_batching_join_and_batch_independence(pair):
    """A request added while others run finishes correctly, and greedy results do not depend on which
    requests shared the batch (alone, in a crowd, joining midway)."""
    spec = Engine(engine_config(pair[0], draft=pair[1], num_speculative_tokens=3, block_size=8,
                               max_num_seqs=4))
    prompts = mixed_prompts(9, seed=4)
    params = SamplingParams(temperature=0, max_tokens=20)
    alone = [spec.generate([p], params)[0].token_ids for p in prompts]
    assert [g.token_ids for g in spec.generate(prompts, params)] == alone  # 9 requests, at most 4 at once

    ids = [spec.add_request(p, params) for p in prompts[:3]]
    outputs: dict[str, list[int]] = {i: [] for i in ids}
    for _ in range(3):
        for out in spec.step():
            outputs[out.request_id] += out.token_ids
    assert all(outputs[i] for i in ids)  # the first three are mid-generation
    late = spec.add_request(prompts[3], params)
    outputs[late] = []
    while spec.has_unfinished():
        for out in spec.step():
            outputs[out.request_id] += out.token_ids
    assert [outputs[i] for i in ids + [late]] == alone[:4]
