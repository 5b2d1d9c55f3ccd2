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
where p has no mass in the group). With all-singleton groups this is `block`'s torch form draw for draw.

Q_c and P_c are enumerated over all groups at every position (O(nnz) per position and row: cheap for the
bundles' tables; there is no thinning form, so Llasa-size tables with real groups cost more than `pcg`),
with engine/ops/verify.py's block steps as torch ops (no compiled twin yet).
"""

from __future__ import annotations

import torch
from pcgtts.asg_tables.table import ASGTable
from pcgtts.engine.acceptance.base import assemble, check_shapes
from pcgtts.engine.acceptance.pcg import PCGRule
from pcgtts.engine.acceptance.sampling import VerifyUniforms, sample_rows
from pcgtts.engine.acceptance.verdict import Verdict
from pcgtts.engine.ops.verify import residual_rows, running_weights, stop_position, weighted_excess


class PCGBlockRule(PCGRule):
    """PCG's table handling (loading, device moves, the GroupLayout) with the block's verify."""

    name = "pcg-block"
    has_compiled_form = False

    def __init__(self, table: ASGTable | str, residual: str = "enumerate"):
        """residual: only "enumerate" (Q_c, P_c over all groups); thinning has no block form here."""
        if residual != "enumerate":
            raise ValueError(f"pcg-block enumerates the groups' masses; residual={residual!r} is not "
                             "supported")
        super().__init__(table, residual="enumerate")

    def verify(self, draft_tokens, draft_probs, target_probs, generator=None) -> Verdict:
        check_shapes(draft_tokens, draft_probs, target_probs)
        device, vocab = draft_probs.device, draft_probs.shape[-1]
        layout = self._layout_on(device)
        if vocab != self.table.vocab_size:
            raise ValueError(f"probs over {vocab} tokens, ASG table over {self.table.vocab_size}")
        b, g = draft_tokens.shape
        u = VerifyUniforms.draw(generator, b, g, device, in_group=True)
        labels, eta = self.table.draw_label(draft_tokens, u.accept)  # K_j ~ w_{·,x_j}; eta independent of K
        draft_c = self.table.coarse(draft_probs.float())  # P_c [B, γ, M]
        target_c = self.table.coarse(target_probs.float())  # Q_c [B, γ+1, M]
        at = labels[:, :, None]
        weights = running_weights(torch.gather(target_c[:, :g], 2, at).squeeze(2),
                                  torch.gather(draft_c, 2, at).squeeze(2))  # [B, γ+1]
        excess = weighted_excess(weights, target_c, draft_c)  # [B, γ+1, M]
        tau = stop_position(weights, excess, eta)
        group = sample_rows(residual_rows(excess, target_c, tau), None, u=u.emit)  # [B]
        # the token inside K' from r(·|K'): p's members where P_c(K') > 0 before the bonus slot, else q's
        rows = torch.arange(b, device=device)
        drafted = tau < g
        p_group = torch.where(drafted, draft_c[rows, tau.clamp(max=g - 1), group], 0.0)
        source = torch.where((p_group > 0)[:, None], draft_probs[rows, tau.clamp(max=g - 1)].float(),
                             target_probs[rows, tau].float())  # [B, V]
        last_token = layout.draw_members(source, group, u.token)
        return assemble(draft_tokens, tau, last_token, lambda: (labels, torch.where(drafted, group, -1)))
