"""Standard speculative sampling (Leviathan et al. 2023; Chen et al. 2023), q = target, p = draft.

Accept x_i with probability min(1, q_i(x_i)/p_i(x_i)); at the first rejection draw from norm[q_i - p_i]_+;
after γ acceptances draw the bonus token from q_{γ+1}. The emitted tokens are distributed exactly as q.
"""

from __future__ import annotations

import torch

from engine.acceptance.base import TokenLevelRule, token_probs


def ratio_test(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    u: torch.Tensor,
    bias: float = 0.0,
) -> torch.Tensor:
    """Bool[B, γ]: u < min(1, q(x)/p(x)) + bias, written as (u - bias)·p(x) < q(x) (no division; a draft
    token with p(x) = 0 is accepted iff q(x) > 0)."""
    p_x = token_probs(draft_probs, draft_tokens).double()  # [B, γ]
    q_x = token_probs(target_probs[:, :-1], draft_tokens).double()
    return (u - bias) * p_x < q_x


class ExactRule(TokenLevelRule):
    name = "exact"

    def accept(self, draft_tokens, draft_probs, target_probs, u):
        return ratio_test(draft_tokens, draft_probs, target_probs, u)
