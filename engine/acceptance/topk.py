"""Top-k tolerance (VADUSA / Llasa+ style): keep a draft token if it is among the target's k most likely.

Accept x_i iff q_i(x_i) > 0 and fewer than k tokens have larger target probability (ties with the k-th value
are accepted). On rejection the token is resampled from q_i itself, as Llasa+ resamples from the backbone.
Not distribution-preserving. k >= V accepts every token the target allows (q_i(x_i) > 0); the q > 0
condition keeps tokens that warping or masking removed from the target (e.g. a forbidden end token) out.
"""

from __future__ import annotations

import torch
from pcgtts.engine.acceptance.base import TokenLevelRule, token_probs


class TopKRule(TokenLevelRule):
    name = "topk"

    def __init__(self, k: int = 50):
        if k < 1:
            raise ValueError("topk k must be >= 1")
        self.k = int(k)

    def accept(self, draft_tokens, draft_probs, target_probs, u):
        q = target_probs[:, :-1]  # [B, γ, V]
        q_x = token_probs(q, draft_tokens)  # [B, γ]
        if self.k >= q.shape[-1]:
            return q_x > 0
        # x is in the top k iff q(x) reaches the k-th largest value (torch.topk costs less on CPU than
        # counting the tokens above q(x) with one comparison pass)
        kth = torch.topk(q, self.k, dim=-1).values[..., -1].float()  # [B, γ]
        return (q_x > 0) & (q_x >= kth)

    def recovery_subtrahend(self, draft_rows, draft_token):
        return torch.zeros_like(draft_rows)

    def __repr__(self) -> str:
        return f"TopKRule(k={self.k})"
