"""Several candidates for one draft position (a token tree's first level), verified by recursive rejection
sampling over them, at token level (exact) or over ASG groups (pcg).

Draft side (`draw_siblings`): candidate i is drawn from p_i, the draft's distribution p with every token
that shares a group with an earlier candidate taken out and the rest renormalised (token level: the earlier
candidates themselves). A row with no mass left has no more candidates (token -1).

Verify side (`verify_siblings`), with coarse masses over groups (Q_c of the target q, P_i of p_i):
  R_1 = Q_c; for each candidate x_i: label K_i ~ w_{·,x_i} (so K_i ~ P_i), accept with
  min(1, R_i(K_i)/P_i(K_i)) and emit x_i; else R_{i+1} = norm[R_i - P_i]_+. No candidate accepted: a group
  K' ~ R_{k+1}, then a token ∝ w_{K',t} q(t) inside it.
Why it is exact: each stage is one speculative-sampling step with draft distribution P_i and target R_i,
so given everything before it the stage emits a label distributed as R_i, its rejection branch passing on
exactly norm[R_i - P_i]_+ = R_{i+1}; whatever the earlier candidates were, p_i is fixed before the stage
draws. A rejected label has R_i(K_i) < P_i(K_i), so R_{i+1}(K_i) = 0: leaving its tokens out of later
candidates loses nothing. So the emitted label follows Q_c exactly, and with singleton groups (group t =
{t}) the emitted token follows q: token-level recursive rejection sampling without replacement. As in PCG,
within an accepted group the token follows the draft.

Uniforms: u[:, i] is candidate i's label and test (ASGTable.draw_label: one uniform serves both), u[:, k]
the residual's group, u[:, k+1] the token inside it. Rows go together (a loop over the k candidates only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pcgtts.asg_tables.csr import gather_segments
from pcgtts.engine.acceptance.sampling import sample_rows
from pcgtts.engine.ops.verify import GroupLayout


@dataclass(frozen=True)
class SiblingVerdict:
    chosen: torch.Tensor  # Long[B]: the accepted candidate, -1 where none was
    token: torch.Tensor  # Long[B]: the emitted token (the candidate, or the residual's draw)
    group: torch.Tensor  # Long[B]: its group label


def sharing_a_group(layout: GroupLayout, tokens: torch.Tensor) -> torch.Tensor:
    """Bool[B, V]: the tokens that share a group with tokens[b] (Long[B]; the token itself included)."""
    table = layout.table
    index = table.index()
    row_of, groups = gather_segments(index.token_indptr, index.token_groups, tokens)  # each token's groups
    row_of_member, members = gather_segments(index.group_indptr, index.group_members, groups)
    mask = torch.zeros(tokens.shape[0], table.vocab_size, dtype=torch.bool, device=tokens.device)
    mask[row_of[row_of_member], members] = True
    return mask


def draw_siblings(layout: GroupLayout, p: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k candidates per row: p Float[B, V] (the draft's processed distribution), u Float64[B, k] ->
    (Long[B, k] candidates, -1 where absent; Float32[B, k, V] the distribution each was drawn from, zeros
    where absent)."""
    b, k = u.shape
    siblings = torch.full((b, k), -1, dtype=torch.long, device=p.device)
    probs = torch.zeros(b, k, p.shape[-1], dtype=torch.float32, device=p.device)
    remaining = p.float().clone()  # [B, V] p with earlier candidates' groups taken out
    for i in range(k):
        total = remaining.sum(-1, keepdim=True)  # [B, 1]
        present = total[:, 0] > 0
        if not bool(present.any()):
            break
        probs[:, i] = torch.where(present[:, None], remaining / total.clamp(min=1e-30), 0.0)
        x = sample_rows(remaining, None, u=u[:, i])
        siblings[:, i] = torch.where(present, x, -1)
        if i + 1 < k:
            remaining.masked_fill_(sharing_a_group(layout, x), 0.0)
    return siblings, probs


def verify_siblings(layout: GroupLayout, siblings: torch.Tensor, sibling_probs: torch.Tensor,
                    q: torch.Tensor, u: torch.Tensor) -> SiblingVerdict:
    """siblings Long[B, k] (-1: absent), sibling_probs Float[B, k, V] (what `draw_siblings` gives),
    q Float[B, V] the target's distribution at their position, u Float64[B, k+2] -> the verdict."""
    table = layout.table
    b, k = siblings.shape
    residual = table.coarse(q.double())  # [B, M] R_1 = Q_c
    chosen = torch.full((b,), -1, dtype=torch.long, device=q.device)
    token = torch.full((b,), -1, dtype=torch.long, device=q.device)
    group = torch.full((b,), -1, dtype=torch.long, device=q.device)
    open_rows = torch.ones(b, dtype=torch.bool, device=q.device)
    for i in range(k):
        present = siblings[:, i] >= 0
        x = siblings[:, i].clamp(min=0)
        labels, u_test = table.draw_label(x, u[:, i])
        p_c = table.coarse(sibling_probs[:, i].double())  # [B, M] P_i
        accept = open_rows & present & (u_test * p_c.gather(1, labels[:, None])[:, 0]
                                        < residual.gather(1, labels[:, None])[:, 0])
        chosen = torch.where(accept, i, chosen)
        token = torch.where(accept, x, token)
        group = torch.where(accept, labels, group)
        open_rows &= ~accept
        passed_on = (residual - p_c).clamp_(min=0.0)
        total = passed_on.sum(-1, keepdim=True)
        # rows still open after this candidate take R_{i+1}; a residual can vanish only by rounding (where
        # R_i == P_i, which rejects with probability 0): such a row keeps R_i
        update = (open_rows & present & (total[:, 0] > 0))[:, None]
        residual = torch.where(update, passed_on / total.clamp(min=1e-300), residual)
    rows = torch.nonzero(open_rows).flatten()
    if rows.numel():
        groups = sample_rows(residual[rows], None, u=u[rows, k])
        token[rows] = layout.draw_members(q[rows].float(), groups, u[rows, k + 1])
        group[rows] = groups
    return SiblingVerdict(chosen=chosen, token=token, group=group)
