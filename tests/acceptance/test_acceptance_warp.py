"""logits_to_probs: the single temperature/top-k/top-p warp shared by draft and target."""

from __future__ import annotations

import pytest
import torch
from pcgtts.engine.acceptance import logits_to_probs
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper


def hf_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Hugging Face's warpers in generate()'s order: temperature, top-k, top-p, then softmax."""
    scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return torch.softmax(scores, dim=-1)


@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(1.0, 0, 1.0), (0.8, 0, 1.0), (0.8, 50, 1.0), (0.7, 0, 0.9), (1.3, 20, 0.5)]
)
def test_matches_hugging_face_warpers(temperature, top_k, top_p):
    logits = torch.randn(6, 1000, generator=torch.Generator().manual_seed(0)) * 3
    ours = logits_to_probs(logits, temperature, top_k, top_p)
    torch.testing.assert_close(ours, hf_probs(logits, temperature, top_k, top_p), atol=1e-6, rtol=1e-5)
    if top_k:
        kept = (ours > 0).sum(-1)
        assert bool((kept == top_k).all()) if top_p == 1 else bool((kept <= top_k).all())


def test_greedy_is_one_hot_argmax():
    logits = torch.randn(4, 3, 77, generator=torch.Generator().manual_seed(1))
    probs = logits_to_probs(logits, temperature=0.0, top_k=5, top_p=0.3)
    assert torch.equal(probs.argmax(-1), logits.argmax(-1))
    assert torch.equal(probs.sum(-1), torch.ones(4, 3)) and bool(((probs == 0) | (probs == 1)).all())


def test_per_row_parameters_apply_to_every_position_of_their_row():
    # [B, γ+1, V] target logits with one sampling setting per sequence b.
    logits = torch.randn(3, 4, 200, generator=torch.Generator().manual_seed(2))
    temperature, top_k = torch.tensor([0.0, 0.8, 1.2]), torch.tensor([0, 10, 0])
    top_p = torch.tensor([1.0, 1.0, 0.6])
    probs = logits_to_probs(logits, temperature, top_k, top_p)
    for b in range(3):
        alone = logits_to_probs(logits[b], float(temperature[b]), int(top_k[b]), float(top_p[b]))
        torch.testing.assert_close(probs[b], alone)
    assert bool((probs[0].max(-1).values == 1).all())
    assert bool(((probs[1] > 0).sum(-1) == 10).all())


def test_wrong_length_parameter_is_an_error():
    with pytest.raises(ValueError):
        logits_to_probs(torch.zeros(3, 4, 10), temperature=torch.ones(2))
