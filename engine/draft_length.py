"""Draft length that follows the draft's confidence (EngineConfig.draft_confidence).

A row's first proposal is always verified; each later proposal x_j is verified only while the draft was sure
of its position: the top probability of p_j (the draft's distribution there, max_t p_j(t)) is at least θ at
every position from 2 up to j. A row never drafts past its γ (the engine's, or the request's own). So a
row whose draft is sure of what comes verifies up to γ drafts in one target forward and an unsure one stops
early, where the per-position acceptance falls off.

Why the top probability at x_j's own position: on the shipped bundle it predicts whether the target accepts
x_j once its prefix is accepted (area under the ROC curve 0.79-0.83 at positions 2-7), while the draft's
probability of its previous proposal, p_{j-1}(x_{j-1}), which the first version of this setting stopped on,
does not (0.50-0.56): it only flags that x_{j-1} itself is likely rejected. At 4-5 drafts per row on average
it gains up to 0.06 tokens per verify step over a fixed γ of the same mean length, the previous-token rule
0.02 (bench/results/draft-length/stopping_rules.py).

Exactness: whether x_j is verified depends only on p_2..p_j, functions of the context and x_1..x_{j-1} (a
stopping time of the draft's own process); x_j itself is drawn from p_j either way and never dropped because
of what it turned out to be, so every verified x_j is a plain sample of p_j given its prefix and each
acceptance rule keeps its guarantee at any length (the engine already verifies each row on its own first γ_i
drafts). Stopping on the token's own probability (keep x_j only if p_j(x_j) ≥ θ) would bias the verified
tokens.
"""

from __future__ import annotations

import torch


def confident_lengths(confidence: torch.Tensor, caps: torch.Tensor, threshold: float) -> torch.Tensor:
    """Each row's draft length: 1 + the number of leading positions j ≥ 2 whose top probability is at least
    threshold, at most its cap.

    confidence: Float[B, J], max_t p_j(t) at the row's positions 1..J (the first is not read); caps: Long[B],
    each row's own γ (≥ 1); threshold 0 drafts every row to min(J, cap). -> Long[B] in [1, caps]."""
    going = torch.cumprod((confidence[:, 1:] >= threshold).long(), dim=1)  # [B, J-1]: x_{j+2} verified
    return torch.minimum(1 + going.sum(dim=1), caps)


def still_drafting(confidence_so_far: torch.Tensor, caps: torch.Tensor, threshold: float) -> bool:
    """Whether the draft goes on to position j+2, given the top probabilities at positions 1..j+1
    (Float[B, j+1]) and each row's cap (Long[B]): some row below its cap verifies every position so far."""
    made = confidence_so_far.shape[1]
    going = (confidence_so_far[:, 1:] >= threshold).all(dim=1) & (caps > made)
    return bool(going.any())
