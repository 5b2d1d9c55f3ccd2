"""The rule interface and the batched bookkeeping every rule shares.

Shapes: B sequences, γ draft tokens each, vocabulary V.
  draft_tokens  Long[B, γ]      tokens the draft sampled, x_i ~ p_i
  draft_probs   Float[B, γ, V]  p_i, already warped (see warp.py)
  target_probs  Float[B, γ+1, V] q_i; the last position serves the bonus token
Rows are processed together; the only Python loops are over small constants, never over the batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from pcgtts.engine.acceptance.sampling import VerifyUniforms, sample_rows
from pcgtts.engine.acceptance.verdict import Verdict


def check_shapes(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor) -> None:
    b, g = draft_tokens.shape
    if draft_probs.shape[:2] != (b, g) or target_probs.shape[:2] != (b, g + 1):
        raise ValueError(
            f"shape mismatch: draft_tokens {tuple(draft_tokens.shape)}, draft_probs "
            f"{tuple(draft_probs.shape)}, target_probs {tuple(target_probs.shape)}"
        )
    if draft_probs.shape[-1] != target_probs.shape[-1]:
        raise ValueError("draft and target vocabularies differ")


def token_probs(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """probs[b, i, tokens[b, i]] as float32: [B, γ]."""
    return torch.gather(probs, -1, tokens.unsqueeze(-1)).squeeze(-1).float()


def count_accepted(accept: torch.Tensor) -> torch.Tensor:
    """Length of the accepted prefix of each row of Bool[B, γ] -> Long[B]."""
    return torch.cumprod(accept.long(), dim=1).sum(dim=1)


def select_rows(probs: torch.Tensor, batch: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """probs[batch[r], position[r], :] as float32 -> [R, V]."""
    if probs.is_contiguous():  # whole-row copies (index_select) are far faster than element-wise indexing
        return probs.flatten(0, 1).index_select(0, batch * probs.shape[1] + position).float()
    return probs[batch, position].float()


def rows_at(probs: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """probs[b, position[b], :] as float32 -> [B, V]."""
    return select_rows(probs, torch.arange(probs.shape[0], device=probs.device), position)


def draft_rows_or_zero(draft_probs: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """p at the emission position, zero where the position is γ (the bonus slot has no draft) -> [B, V]."""
    g = draft_probs.shape[1]
    return rows_at(draft_probs, position.clamp(max=g - 1)).masked_fill_(position[:, None] >= g, 0.0)


def assemble(
    draft_tokens: torch.Tensor,
    num_accepted: torch.Tensor,
    last_token: torch.Tensor,
    labels: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> Verdict:
    """Accepted prefix, then `last_token` at position num_accepted, -1 after it.

    labels: PCG's group labels, built only if the verdict's `groups` is read: () -> (Long[B, γ] labels of
    the draft positions, Long[B] label of the last token)."""
    b, g = draft_tokens.shape
    at = num_accepted[:, None]  # [B, 1]
    after = torch.arange(g + 1, device=draft_tokens.device)[None, :] > at  # [B, γ+1]

    def place(prefix: torch.Tensor, last: torch.Tensor) -> torch.Tensor:  # [B, γ], [B] -> [B, γ+1]
        last = last.long()[:, None]
        return torch.cat([prefix.long(), last], dim=1).scatter_(1, at, last).masked_fill_(after, -1)

    def groups() -> torch.Tensor:
        if labels is None:
            return torch.full((b, g + 1), -1, dtype=torch.long, device=draft_tokens.device)
        return place(*labels())

    return Verdict(tokens=place(draft_tokens, last_token), num_accepted=num_accepted, groups=groups)


def token_level_verdict(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    accepted: torch.Tensor,
    u_emit: torch.Tensor,
    subtrahend: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> Verdict:
    """The verdict of a token-level rule from its test: the accepted prefix of Bool[B, γ], then one token
    drawn with u_emit (Float64[B]) from norm[q - s]_+ at the emission position, where s is p there (the
    exact residual; 0 at the bonus slot) or subtrahend(p there, the rejected draft token)."""
    g = draft_tokens.shape[1]
    num_accepted = count_accepted(accepted)
    taken = draft_rows_or_zero(draft_probs, num_accepted)  # [B, V], zero on bonus rows
    if subtrahend is not None:
        x = torch.gather(draft_tokens, 1, num_accepted.clamp(max=g - 1)[:, None]).squeeze(1)
        taken = subtrahend(taken, x)
    residual = rows_at(target_probs, num_accepted).sub_(taken).clamp_(min=0.0)  # [B, V], own copy
    # a residual can vanish only where p == q, which rejects with probability 0
    residual = target_where_empty(residual, target_probs, num_accepted)
    return assemble(draft_tokens, num_accepted, sample_rows(residual, None, u=u_emit))


def target_where_empty(residual: torch.Tensor, target_probs: torch.Tensor,
                       position: torch.Tensor) -> torch.Tensor:
    """residual [B, X] (modified in place) with each row that has no mass replaced by q at that row's
    position (target_probs [B, γ+1, X], position Long[B]): a residual vanishes only through rounding or
    where p == q, so the draw from it is always well defined."""
    empty = torch.nonzero(residual.sum(-1) <= 0).flatten()
    if empty.numel():
        residual[empty] = target_probs[empty, position[empty]].float()
    return residual


class AcceptanceRule(ABC):
    """verify(draft_tokens, draft_probs, target_probs, generator) -> Verdict."""

    name: str = ""
    # Whether the rule works over groups of tokens, given by an ASG table (`table=`) unless its own
    # parameters supply them; RuleCache hands such rules the table a request picks.
    uses_asg_table: bool = False
    # Whether every random draw of `verify` is `uniform((B, ...))` over the batch's rows, in an order that
    # does not depend on the data: then `generator` may be a RowGenerators (rows with their own generators
    # verified in one call, each drawing what it would alone).
    row_draws: bool = False
    # Whether the rule's verify has a compiled twin (engine/ops): then it takes `ops=` (the forms to run).
    has_compiled_form: bool = False

    @abstractmethod
    def verify(
        self,
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor,
        target_probs: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> Verdict: ...

    def sibling_layout(self, vocab_size: int, device: torch.device):
        """The GroupLayout (engine/ops/verify.py; it imports this module, hence no annotation) over which
        the rule verifies a token tree's candidates for one position (engine/acceptance/tree.py):
        singletons for a token-level rule, its ASG table for a group rule; None where the rule has no tree
        form (a tree's row then verifies its first branch as a chain)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class TokenLevelRule(AcceptanceRule):
    """Rules that test each draft token and, at the first rejection, draw one token from a residual.

    Subclasses decide `accept` (which positions pass) and `recovery_subtrahend` (what is taken away from q
    before the recovery draw). The bonus slot always samples q itself, since its subtrahend is zero."""

    row_draws = True

    @abstractmethod
    def accept(
        self,
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor,
        target_probs: torch.Tensor,
        u: torch.Tensor,
    ) -> torch.Tensor:
        """Bool[B, γ] from uniforms u: Float64[B, γ]."""

    def recovery_subtrahend(self, draft_rows: torch.Tensor, draft_token: torch.Tensor) -> torch.Tensor:
        """What is subtracted from q at the emission position ([B, V]); by default p (the exact residual)."""
        return draft_rows

    def verify(self, draft_tokens, draft_probs, target_probs, generator=None) -> Verdict:
        check_shapes(draft_tokens, draft_probs, target_probs)
        b, g = draft_tokens.shape
        u = VerifyUniforms.draw(generator, b, g, draft_probs.device)
        accepted = self.accept(draft_tokens, draft_probs, target_probs, u.accept)
        return token_level_verdict(draft_tokens, draft_probs, target_probs, accepted, u.emit,
                                   self.recovery_subtrahend)
