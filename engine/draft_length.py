"""Draft length that follows the draft's confidence (EngineConfig.draft_confidence).

Each row drafts while the draft is sure of what it proposes: after proposing x_j it goes on to x_{j+1} only if
p_j(x_j), the draft's own probability of the token it drew, is at least θ; the first proposal is always made,
and a row never drafts past its γ (the engine's, or the request's own). So a confident row verifies up to γ
drafts in one target forward and an unsure one stops early, where the per-position acceptance falls off.

Exactness: whether x_{j+1} is drafted depends only on x_1..x_j and their draft probabilities (a stopping time
of the draft's own process), and a drafted token is never dropped because of what it turned out to be, so
every verified x_j is still a plain sample of p_j given its prefix and each acceptance rule keeps its
guarantee at any length (the engine already verifies each row on its own first γ_i drafts). Stopping on the
token's own probability instead (keep x_j only if p_j(x_j) ≥ θ) would bias the verified tokens.
"""

from __future__ import annotations

import torch


def confident_lengths(confidence: torch.Tensor, caps: torch.Tensor, threshold: float) -> torch.Tensor:
    """Each row's draft length: 1 + the number of leading positions j < γ-1 with p_j(x_j) ≥ threshold,
    at most its cap.

    confidence: Float[B, γ], p_j(x_j) of the row's j-th proposal; caps: Long[B], each row's own γ (≥ 1);
    threshold 0 drafts every row to its cap. -> Long[B] in [1, caps]."""
    g = confidence.shape[1]
    going = torch.cumprod((confidence[:, :g - 1] >= threshold).long(), dim=1)  # [B, γ-1]: x_{j+2} drafted
    return torch.minimum(1 + going.sum(dim=1), caps)


def still_drafting(confidence_so_far: torch.Tensor, caps: torch.Tensor, threshold: float) -> bool:
    """Whether any row goes on to the next proposal, given p_j(x_j) for the j+1 proposals made so far
    (Float[B, j+1]) and each row's cap (Long[B])."""
    made = confidence_so_far.shape[1]
    going = (confidence_so_far >= threshold).all(dim=1) & (caps > made)
    return bool(going.any())
