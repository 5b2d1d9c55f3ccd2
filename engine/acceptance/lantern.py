"""LANTERN (Jang et al., ICLR 2025): relaxed acceptance that credits the target mass of latent neighbours.

For draft token x with neighbours n_1..n_k (nearest first), let m be the largest index with
Σ_{j<=m} q(n_j) <= δ and p̃(x) = q(x) + Σ_{j<=m} q(n_j). Accept x if u <= p̃(x)/p(x). On rejection the
draft distribution is zeroed on x and its k neighbours and the token drawn from norm[q - p']_+ (LANTERN's
approximate residual). Not distribution-preserving: the relaxed q̃ stays within TV distance δ of q.

Neighbours come from `embeddings=` (cosine k-NN of the rows of tokens [offset, offset + n), as the
paper's latent proximity) or from an ASG `table=` (the other members of G(x), unordered).
"""

from __future__ import annotations

import torch
from pcgtts.asg_tables.neighbours import NeighbourIndex, nearest_neighbours, neighbours_from_table
from pcgtts.asg_tables.table import ASGTable
from pcgtts.engine.acceptance.base import TokenLevelRule, token_probs


class LanternRule(TokenLevelRule):
    name = "lantern"
    uses_asg_table = True

    def __init__(
        self,
        k: int = 1000,
        delta: float = 0.1,
        *,
        table: ASGTable | str | None = None,
        embeddings: torch.Tensor | None = None,
        offset: int = 0,
        neighbours: NeighbourIndex | None = None,
    ):
        if (table is not None) + (embeddings is not None) + (neighbours is not None) != 1:
            raise ValueError("lantern needs exactly one of table=, embeddings= or neighbours=")
        if delta < 0 or k < 1:
            raise ValueError("lantern needs k >= 1 and delta >= 0")
        self.k, self.delta = int(k), float(delta)
        if embeddings is not None:
            neighbours = nearest_neighbours(embeddings, self.k, offset=offset)
        elif table is not None:
            neighbours = neighbours_from_table(
                ASGTable.load(table) if isinstance(table, str) else table, self.k
            )
        self.neighbours = neighbours

    def _neighbours_of(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.neighbours.ids.device != tokens.device:
            self.neighbours = self.neighbours.to(tokens.device)
        return self.neighbours.of(tokens)

    def accept(self, draft_tokens, draft_probs, target_probs, u):
        q = target_probs[:, :-1]  # [B, γ, V]
        nb = self._neighbours_of(draft_tokens)  # [B, γ, k]
        q_nb = torch.gather(q, -1, nb.clamp(min=0)).double() * (nb >= 0)
        included = torch.cumsum(q_nb, dim=-1) <= self.delta  # a prefix, since the sums only grow
        relaxed = token_probs(q, draft_tokens).double() + (q_nb * included).sum(-1)  # p̃(x): [B, γ]
        return u * token_probs(draft_probs, draft_tokens).double() < relaxed

    def recovery_subtrahend(self, draft_rows, draft_token):
        nb = self._neighbours_of(draft_token)  # [B, k]
        vocab = draft_rows.shape[1]
        zeroed = torch.cat([draft_token[:, None], nb], dim=1)  # [B, k+1]; padding -1 goes to a spare column
        keep = torch.ones(draft_rows.shape[0], vocab + 1, dtype=draft_rows.dtype, device=draft_rows.device)
        keep.scatter_(1, torch.where(zeroed < 0, vocab, zeroed), 0.0)
        return draft_rows * keep[:, :vocab]

    def __repr__(self) -> str:
        return f"LanternRule(k={self.k}, delta={self.delta})"
