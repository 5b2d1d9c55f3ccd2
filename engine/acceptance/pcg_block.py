"""Block verification (block.py) at group level: PCG's guarantee with a block's acceptance, over an ASG table.

Each draft position emits a pair (group label K, token x): x ~ p and K ~ w_{·,x} as PCG labels it, so the
draft's pair law is P_c(K) p(x|K) with p(x|K) = w_{K,x} p(x) / P_c(K). As target take the hybrid law
Q_c(K) r(x|K), r = p(·|K) where P_c(K) > 0 (else the q-conditional w_{K,x} q(x) / Q_c(K)). The pair ratio
is then Q_c(K)/P_c(K), whatever x, and block verification over pairs is block verification over labels:
  w_{j+1} = min(w_j Q_c(K_j)/P_c(K_j), 1), residual mass Σ_K [w_j Q_c(K) - P_c(K)]_+ at position j;
  at the stop τ < γ a group K' ~ norm[w_τ Q_c - P_c]_+ and a token from r(·|K'); after γ drafts kept the
  bonus is a plain sample of q (label -1), as PCG's: the pair (K', x) ~ Q_c(K) q(x|K) has x ~ q.
So the emitted labels are distributed, jointly over the block, as the target's coarse law (each label ~ Q_c
given the emitted prefix), the group-level guarantee PCG gives; within a group the token follows p (q
where p has no mass in the group). With all-singleton groups this is `block` draw for draw (form by form).

Q_c and P_c are enumerated over all groups at every position (O(nnz) per position and row: cheap for the
bundles' tables; there is no thinning form, so Llasa-size tables with real groups cost more than `pcg`).
The math is engine/ops/verify.py's BLOCK_GROUP_VERIFY: block's torch steps over groups, or a compiled loop.
"""

from __future__ import annotations

from pcgtts.asg_tables.table import ASGTable
from pcgtts.engine.acceptance.pcg import PCGRule
from pcgtts.engine.acceptance.sampling import VerifyUniforms
from pcgtts.engine.acceptance.verdict import Verdict
from pcgtts.engine.ops import Ops
from pcgtts.engine.ops.verify import BLOCK_GROUP_VERIFY


class PCGBlockRule(PCGRule):
    """PCG's table handling (loading, device moves, the GroupLayout) with the block's verify."""

    name = "pcg-block"

    def __init__(self, table: ASGTable | str, residual: str = "enumerate", ops: Ops | None = None):
        """residual: only "enumerate" (Q_c, P_c over all groups); thinning has no block form here.
        ops: the forms of the verify (engine/ops); None: the one that applies to each call's tensors."""
        if residual != "enumerate":
            raise ValueError(f"pcg-block enumerates the groups' masses; residual={residual!r} is not "
                             "supported")
        super().__init__(table, residual="enumerate", ops=ops)

    def verify(self, draft_tokens, draft_probs, target_probs, generator=None) -> Verdict:
        layout = self._checked_layout(draft_tokens, draft_probs, target_probs)
        b, g = draft_tokens.shape
        u = VerifyUniforms.draw(generator, b, g, draft_probs.device, in_group=True)
        verify = Ops.given_or_for(self.ops, draft_probs).form(BLOCK_GROUP_VERIFY)
        return verify(layout, draft_tokens, draft_probs, target_probs, u)

    def sibling_layout(self, vocab_size, device):
        return None  # no tree form tested for block verification: a tree's row verifies its first branch
