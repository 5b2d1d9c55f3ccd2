"""The feature-head draft: the engine's head computes the training module's function, and speculation with
it keeps decoding exact (greedy: token for token; sampled: the target's distribution, chi-square)."""

from __future__ import annotations

import pytest
import torch
from engine_support import engine_config, hf_model, save_feature_head, save_tiny_llama
from pcgtts.engine import Engine, SamplingParams
from pcgtts.engine.model.feature_head import is_feature_head, load_feature_head
from pcgtts.engine.model.loader import load_llama
from test_engine_sampling import ALPHA, PROMPT, SETTINGS, V, chi2_pvalue, reference_probs


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("head")
    target = save_tiny_llama(root / "target", vocab=V, hidden=32, heads=2, kv_heads=1, intermediate=64,
                             layers=2, seed=21, init_std=0.3)
    return target, save_feature_head(target, root / "head")


@pytest.mark.parametrize("few_ops", [False, True])
def test_engine_head_equals_training_module(tiny, few_ops):
    from pcgtts.recipes.demo.train_draft_head import FeatureHeadModule
    from safetensors.torch import load_file

    target_dir, head_dir = tiny
    assert is_feature_head(head_dir) and not is_feature_head(target_dir)
    model = load_llama(target_dir, "cpu", "float32")
    head = load_feature_head(head_dir, model, few_ops)
    module = FeatureHeadModule(head.cfg, hf_model(target_dir).model.embed_tokens.weight)
    module.load_state_dict({k: v.float() for k, v in load_file(str(head_dir / "model.safetensors")).items()})
    gen = torch.Generator().manual_seed(0)
    state = torch.randn(5, head.cfg.hidden_size, generator=gen)
    tokens = torch.randint(0, V, (5,), generator=gen)
    for _ in range(3):  # chained, as a step proposes γ tokens
        want = module(state, tokens).detach()
        got = head(state, tokens)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        state, tokens = want, (tokens + 1) % V


def test_head_rejects_a_target_of_another_width(tiny, tmp_path):
    other = save_tiny_llama(tmp_path / "other", vocab=V, hidden=64, layers=1, seed=1)
    with pytest.raises(ValueError, match="does not fit"):
        Engine(engine_config(other, draft=tiny[1]))


@pytest.mark.parametrize("gamma", [1, 3])
def test_greedy_head_speculation_equals_target_only(tmp_path, gamma):
    target = save_tiny_llama(tmp_path / "target", vocab=512, layers=3, seed=11)
    head = save_feature_head(target, tmp_path / "head", inner=128, scale=0.3)
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 512, (k,), generator=gen).tolist() for k in (1, 5, 17, 33, 2, 40)]
    params = SamplingParams(temperature=0, max_tokens=24)
    expected = [g.token_ids for g in Engine(engine_config(target, block_size=8)).generate(prompts, params)]
    spec = Engine(engine_config(target, draft=head, num_speculative_tokens=gamma, block_size=8))
    assert spec.head is not None and spec.draft is None
    got = spec.generate(prompts, params)
    assert [g.token_ids for g in got] == expected
    m = spec.metrics()
    assert 0 < m.spec_accepted_tokens < m.spec_drafted_tokens  # both branches of verification
    assert spec.kv_blocks_in_use() == (0, 0)


def reference_joint_23(target_dir, params: SamplingParams) -> torch.Tensor:
    """P(x2, x3) [V, V] of the processed target (x1 summed out)."""
    hf = hf_model(target_dir)
    joint = torch.zeros(V, V, dtype=torch.float64)
    p1 = reference_probs(hf, PROMPT, [], params)
    for x1 in range(V):
        if p1[x1] == 0:
            continue
        p2 = reference_probs(hf, PROMPT + [x1], [x1], params)
        for x2 in range(V):
            if p2[x2] > 0:
                joint[x2] += p1[x1] * p2[x2] * reference_probs(hf, PROMPT + [x1, x2], [x1, x2], params)
    return joint


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_head_speculation_has_target_distribution(tiny, setting):
    """x1 comes from the first (target-only) step, which gives the row its state; x2 and x3 from the first
    speculative step (γ = 2: both from the head's chained proposals or their resampling)."""
    target, head = tiny
    params = SETTINGS[setting]
    params = SamplingParams(**{**params.__dict__, "max_tokens": 3})
    engine = Engine(engine_config(target, draft=head, num_speculative_tokens=2, max_num_seqs=256,
                                  max_waiting=4096, kv_budget_tokens=256 * 16, block_size=4, seed=5))
    counts = torch.zeros(V, V, dtype=torch.long)
    for g in engine.generate([PROMPT] * 3000, params):
        counts[g.token_ids[1], g.token_ids[2]] += 1
    assert chi2_pvalue(counts, reference_joint_23(target, params)) > ALPHA
    m = engine.metrics()
    assert 0.1 < m.spec_accepted_tokens / m.spec_drafted_tokens < 0.95

