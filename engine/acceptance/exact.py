"""Standard speculative sampling (Leviathan et al. 2023; Chen et al. 2023), q = target, p = draft.

Accept x_i with probability min(1, q_i(x_i)/p_i(x_i)); at the first rejection draw from norm[q_i - p_i]_+;
after γ acceptances draw the bonus token from q_{γ+1}. The emitted tokens are distributed exactly as q.
On CPU tensors this runs as PCG's compiled loop over all-singleton groups (group k = {k}), which is this
rule draw for draw: its coarse test and residual are the token-level ones (tests/acceptance).
"""

from __future__ import annotations

import torch
from pcgtts.asg_tables.table import ASGTable
from pcgtts.engine.acceptance.base import TokenLevelRule, check_shapes, token_probs
from pcgtts.engine.acceptance.verdict import Verdict
from pcgtts.engine.cpu_kernel import compiled_applies


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

    def __init__(self, compiled: bool = True):
        """compiled: where `compiled_applies` (CPU tensors over at most COMPILED_MAX_V tokens), verify with
        the compiled loop of pcg_cpu.py over singleton groups (a fifth of the torch ops' cost at the demo
        vocabulary); False keeps the torch ops every device runs."""
        self.compiled = bool(compiled)
        self._singletons: dict[int, object] = {}  # vocabulary size -> CompiledPCG over singleton groups
        if self.compiled:
            self._singletons_over(2)  # compiles the loop now (engine start-up), not in the first request

    def accept(self, draft_tokens, draft_probs, target_probs, u):
        return ratio_test(draft_tokens, draft_probs, target_probs, u)

    def verify(self, draft_tokens, draft_probs, target_probs, generator=None) -> Verdict:
        if not (self.compiled and compiled_applies(draft_probs.device, draft_probs.shape[-1])):
            return super().verify(draft_tokens, draft_probs, target_probs, generator)
        check_shapes(draft_tokens, draft_probs, target_probs)
        tokens, _, num_accepted = self._singletons_over(draft_probs.shape[-1]).verify(
            draft_tokens, draft_probs, target_probs, generator)
        return Verdict(tokens, num_accepted, lambda: torch.full_like(tokens, -1))

    def _singletons_over(self, vocab: int):
        """The compiled verify over `vocab` singleton groups, built once per vocabulary size."""
        if vocab not in self._singletons:
            from pcgtts.engine.acceptance.pcg_cpu import CompiledPCG

            self._singletons[vocab] = CompiledPCG(ASGTable.from_groups([], vocab))
        return self._singletons[vocab]
