"""The verify of one speculation round: coarse over ASG groups (PCG), token-level (exact) and block
verification (block, engine/acceptance/block.py), each a Twin.

Shapes as in engine.acceptance: draft_tokens Long[B, γ], draft_probs Float[B, γ, V] (p), target_probs
Float[B, γ+1, V] (q), u: the call's VerifyUniforms (engine.acceptance.sampling), drawn by the rule.

    GROUP_VERIFY   form(layout, draft_tokens, draft_probs, target_probs, u) -> Verdict   (PCG, enumerated)
    TOKEN_VERIFY   form(draft_tokens, draft_probs, target_probs, u) -> Verdict           (exact)
    BLOCK_VERIFY   form(draft_tokens, draft_probs, target_probs, u) -> Verdict           (block)
    BLOCK_GROUP_VERIFY  form(layout, draft_tokens, draft_probs, target_probs, u) -> Verdict  (pcg-block)

PCG per row (w_{k,t} = 1/N(t), P_c / Q_c the coarse-grained p / q; paper's Algorithm 1):
  for i < γ: K_i = the ⌊u_i·N(x_i)⌋-th group of S(x_i); accept while frac(u_i·N(x_i))·P_c(G_K) < Q_c(G_K);
  at the emission position e = accepted count: group ~ [Q_c - P_c]_+ over all groups (P_c = 0 at the bonus
  slot e = γ; Q_c if the residual vanishes), token ~ q(t)·w_{k,t} inside the group.
The token-level rule is this rule over singleton groups (group k = {k}: P_c = p, Q_c = q, the label is the
token, the in-group draw has one choice), so TOKEN_VERIFY's compiled form runs the group loop over
`singleton_layout(V)`; its torch form is the token-level ops of engine.acceptance.base.

The torch form's steps are plain functions over tensors, for callers that lay drafts out their own way (no
Engine, no rule object; any leading shape, e.g. vLLM's flattened [N] drafts with cu_num_draft_tokens [B];
tests/engine/test_ops.py drives them so):

    layout = GroupLayout(table)                                   # once per table and device
    labels, accepted = group_test(layout, draft_token_ids, u, draft_probs, target_probs)    # [N] each
    # per request: the accepted prefix of `accepted`; at its first rejection (or bonus) position the
    # residual q - p (q alone at a bonus position, where no draft was made):
    tokens, groups = residual_draw(layout, excess, q_rows, u_group, u_token)                # [R] each

with u, u_group, u_token Float64 uniforms shaped like their rows. `residual_thinning` draws the same
residual by thinning (O(|G|) per trial instead of O(nnz) per row, for large tables).
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from pcgtts.asg_tables.table import ASGTable
from pcgtts.engine.acceptance.base import (
    assemble,
    check_shapes,
    count_accepted,
    target_where_empty,
    token_level_verdict,
    token_probs,
)
from pcgtts.engine.acceptance.sampling import VerifyUniforms, sample_rows, sample_segments, uniform
from pcgtts.engine.acceptance.verdict import Verdict
from pcgtts.engine.ops import Ops, Twin
from pcgtts.engine.ops.kernel import cpu_kernel, draw_index

# Up to this vocabulary size the group masses are read from padded member matrices ([M, largest group]):
# fewer ops per step; beyond it ragged segment sums and sparse products cost less memory.
DENSE_COARSE_MAX_V = 16384


class GroupLayout:
    """An ASG table as the verify reads it, built once per table (and device): the table itself (for its
    coarse-graining and labels), every group's members as padded rows (small tables), and the CSR arrays
    of the compiled loop (made on its first use)."""

    def __init__(self, table: ASGTable, padded: bool | None = None):
        """padded: read group masses from padded member matrices (default: for at most DENSE_COARSE_MAX_V
        tokens) or from the ragged CSR rows."""
        self.table = table
        self.padded = table.vocab_size <= DENSE_COARSE_MAX_V if padded is None else padded
        if self.padded:
            self.members, self.weights = _padded_groups(table)  # Long / Float64 [M, Gmax]
        self._arrays: tuple[np.ndarray, ...] | None = None
        self._starts: dict[tuple[int, int], torch.Tensor] = {}

    def label_masses(self, draft_rows: torch.Tensor, target_rows: torch.Tensor,
                     labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(P_c, Q_c) of each row's label: rows [..., V], labels Long[...] -> Float64[...] each."""
        if self.padded:  # both in one gather over p and q stacked (a few KB at decode sizes)
            members, weights = self.members[labels], self.weights[labels]  # [..., Gmax]
            both = torch.stack([draft_rows, target_rows])  # [2, ..., V]
            p_c, q_c = (torch.gather(both, -1, members.expand(2, *members.shape)).double() * weights).sum(-1)
            return p_c, q_c
        v = self.table.vocab_size
        flat = labels.flatten()
        rows = (torch.arange(flat.shape[0], device=flat.device),)
        return tuple(self.table.group_mass(x.reshape(-1, v), rows, flat).view(labels.shape)
                     for x in (draft_rows, target_rows))

    def draw_members(self, target_rows: torch.Tensor, groups: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """One member of each group ∝ q(t)·w_{k,t}: target_rows [R, V], groups Long[R], u Float64[R]."""
        if self.padded:
            members = self.members[groups]  # [R, Gmax]
            weights = torch.gather(target_rows, 1, members).double() * self.weights[groups]
            return torch.gather(members, 1, sample_rows(weights, None, u=u)[:, None])[:, 0]
        seg, members = self.table.segments(groups)
        weights = target_rows[seg, members].double() * self.table.inv_owners[members]
        counts = torch.bincount(seg, minlength=groups.shape[0])
        indptr = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
        return members[sample_segments(weights, indptr, None, u=u)]

    def row_starts(self, rows: int, width: int) -> torch.Tensor:
        """Long[rows]: 0, width, 2·width, ... (the first flat row of each sequence), made once per shape."""
        if (rows, width) not in self._starts:
            self._starts[rows, width] = torch.arange(rows, device=self.table.device) * width
        return self._starts[rows, width]

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The compiled loop's view of the table (CPU): group_indptr, group_members, 1/N(t) per membership,
        token_indptr, token_groups, 1/N(t) per token."""
        if self._arrays is None:
            index, inv_owners = self.table.index(), self.table.inv_owners
            self._arrays = (index.group_indptr.contiguous().numpy(), index.group_members.contiguous().numpy(),
                            inv_owners[index.group_members].contiguous().numpy(),
                            index.token_indptr.contiguous().numpy(), index.token_groups.contiguous().numpy(),
                            inv_owners.contiguous().numpy())
        return self._arrays


def _padded_groups(table: ASGTable) -> tuple[torch.Tensor, torch.Tensor]:
    """Members of every group as rows of one matrix, Long[M, Gmax] (padding: token 0), and their weights
    w_{k,t} = 1/N(t), Float64[M, Gmax] (padding: 0)."""
    index, sizes = table.index(), table.group_sizes()
    cols = torch.arange(int(sizes.max()), device=sizes.device)
    inside = cols[None, :] < sizes[:, None]  # [M, Gmax]
    at = (index.group_indptr[:-1, None] + cols[None, :]).clamp(max=index.group_members.shape[0] - 1)
    members = torch.where(inside, index.group_members[at], 0)
    return members, torch.where(inside, table.inv_owners[members], 0.0)


@functools.cache
def singleton_layout(vocab_size: int) -> GroupLayout:
    """Group k = {k} for every token: the group rule over these is the token-level rule."""
    return GroupLayout(ASGTable.from_groups([], vocab_size), padded=False)


# ---- the torch form's steps: plain functions over tensors -------------------------------------------------
def group_test(layout: GroupLayout, draft_tokens: torch.Tensor, u: torch.Tensor, draft_rows: torch.Tensor,
               target_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 1-2 for every draft position at once: its label K ~ w_{·,x} and its coarse test, from one
    uniform each. draft_tokens Long[...], u Float64[...], draft_rows / target_rows: p and q at those
    positions, [..., V] -> (labels Long[...], accepted Bool[...]: frac(u·N(x))·P_c(G_K) < Q_c(G_K))."""
    labels, u_test = layout.table.draw_label(draft_tokens, u)
    p_c, q_c = layout.label_masses(draft_rows, target_rows, labels)
    return labels, u_test * p_c < q_c


def residual_draw(layout: GroupLayout, excess: torch.Tensor, target_rows: torch.Tensor, u_group: torch.Tensor,
                  u_token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 3 by enumeration, O(nnz) per row: a group ~ [Q_c - P_c]_+ (Q_c where that vanishes: P_c == Q_c
    up to rounding, where rejection had probability ~0), then a token inside it ~ q(t)·w_{k,t}.
    excess: q - p at each row's emission position (q alone where no draft was made), [R, V];
    target_rows: q there, [R, V]; u_group, u_token Float64[R] -> (tokens Long[R], groups Long[R])."""
    residual = layout.table.coarse(excess).clamp_(min=0.0)  # [R, M]: Q_c - P_c is q - p coarse-grained
    totals = residual.sum(-1)
    if float(totals.min()) <= 0:
        empty = totals <= 0
        residual[empty] = layout.table.coarse(target_rows[empty]).to(residual.dtype)
    groups = sample_rows(residual, None, u=u_group)
    return layout.draw_members(target_rows, groups, u_token), groups


def residual_thinning(layout: GroupLayout, draft_rows: torch.Tensor, target_rows: torch.Tensor,
                      generator: torch.Generator | None, trials: int, rounds: int
                      ) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Step 3 by thinning, O(|G|) per trial: y ~ q, K' ~ w_{·,y}, keep (y, K') with probability
    1 - P_c(G_K')/Q_c(G_K'), which draws (group, token) exactly as `residual_draw` does. `rounds` rounds of
    `trials` trials per pending row; rows still pending then are drawn by enumeration (float64). Its
    draws depend on the data, so it takes the generator. draft_rows, target_rows [R, V] ->
    (tokens Long[R], groups Long[R], trials spent, rows that needed the enumeration)."""
    r, device = target_rows.shape[0], target_rows.device
    token = torch.full((r,), -1, dtype=torch.long, device=device)
    group = torch.full((r,), -1, dtype=torch.long, device=device)
    pending = torch.arange(r, device=device)
    table, spent = layout.table, 0
    for _ in range(rounds):
        if pending.numel() == 0:
            break
        n = pending.numel()
        spent += n * trials
        u = uniform((2, n, trials), generator, device)
        y = sample_rows(target_rows if n == r else target_rows[pending], generator, u=u[0])  # [n, T], y ~ q
        k, u_keep = table.draw_label(y, u[1])  # [n, T] each
        rows = (pending.repeat_interleave(trials),)
        q_c = table.group_mass(target_rows, rows, k.flatten()).view(n, trials)
        p_c = table.group_mass(draft_rows, rows, k.flatten()).view(n, trials)
        ok = u_keep * q_c < q_c - p_c  # keep with probability [Q_c - P_c]_+ / Q_c
        done = ok.any(dim=1)
        first = ok.long().argmax(dim=1)  # first successful trial: trials are i.i.d., so this is exact
        chosen = pending[done]
        token[chosen] = y[done, first[done]]
        group[chosen] = k[done, first[done]]
        pending = pending[~done]
    if pending.numel():
        q, p = target_rows[pending].double(), draft_rows[pending].double()
        u = uniform((2, pending.numel()), generator, device)
        token[pending], group[pending] = residual_draw(layout, q - p, q, u[0], u[1])
    return token, group, spent, pending.numel()


def group_verify_torch(layout: GroupLayout, draft_tokens: torch.Tensor, draft_probs: torch.Tensor,
                       target_probs: torch.Tensor, u: VerifyUniforms) -> Verdict:
    b, g = draft_tokens.shape
    v = layout.table.vocab_size
    labels, accepted = group_test(layout, draft_tokens, u.accept, draft_probs, target_probs[:, :g])  # [B, γ]
    num_accepted = count_accepted(accepted)
    # q - p at every position (p = 0 at the bonus slot), then each row's emission position
    excess = target_probs.to(torch.float32, copy=True)  # [B, γ+1, V]
    excess[:, :g] -= draft_probs
    emit_row = layout.row_starts(b, g + 1) + num_accepted  # [B] into [B (γ+1)]
    last_token, group = residual_draw(layout, excess.view(-1, v).index_select(0, emit_row),
                                      target_probs.reshape(-1, v).index_select(0, emit_row).float(),
                                      u.emit, u.token)
    return assemble(draft_tokens, num_accepted, last_token,
                    lambda: (labels, torch.where(num_accepted < g, group, -1)))


# ---- the compiled form ------------------------------------------------------------------------------------
@cpu_kernel()
def _group_mass(probs: np.ndarray, g_indptr: np.ndarray, g_members: np.ndarray, member_weight: np.ndarray,
                k: int) -> float:
    """Σ_{t ∈ G_k} probs[t] / N(t) (float64)."""
    mass = 0.0
    for j in range(g_indptr[k], g_indptr[k + 1]):
        mass += probs[g_members[j]] * member_weight[j]
    return mass


# an explicit signature compiles at import (or loads numba's disk cache), not on the first request
@cpu_kernel("void(int64[:, ::1], float32[:, :, ::1], float32[:, :, ::1], float64[:, ::1], float64[::1], "
            "float64[::1], int64[::1], int64[::1], float64[::1], int64[::1], int64[::1], float64[::1], "
            "int64[:, ::1], int64[:, ::1], int64[::1])")
def _verify_rows(draft_tokens, draft_probs, target_probs, u_accept, u_emit, u_token,
                 g_indptr, g_members, member_weight, t_indptr, t_groups, inv_owners, tokens, groups,
                 num_accepted):
    """Fills tokens [B, γ+1] and groups [B, γ+1] as `assemble` lays them out (accepted prefix, the emitted
    token, -1 after; groups: the accepted labels, the residual's group after a rejection, -1 for the bonus
    token and padding), and num_accepted [B]."""
    b_rows, gamma = draft_tokens.shape
    num_groups, vocab = g_indptr.shape[0] - 1, inv_owners.shape[0]
    residual = np.empty(num_groups, dtype=np.float64)
    per_token = np.empty(vocab, dtype=np.float64)
    inside = np.empty(g_members.shape[0], dtype=np.float64)
    for b in range(b_rows):
        tokens[b, :] = -1
        groups[b, :] = -1
        accepted = 0
        while accepted < gamma:
            x = draft_tokens[b, accepted]
            n = t_indptr[x + 1] - t_indptr[x]
            scaled = u_accept[b, accepted] * n
            slot = min(np.floor(scaled), n - 1.0)  # u·N(t) can round up to N(t)
            k = t_groups[t_indptr[x] + np.int64(slot)]
            p_c = _group_mass(draft_probs[b, accepted], g_indptr, g_members, member_weight, k)
            q_c = _group_mass(target_probs[b, accepted], g_indptr, g_members, member_weight, k)
            if (scaled - slot) * p_c >= q_c:
                break
            tokens[b, accepted] = x
            groups[b, accepted] = k
            accepted += 1
        num_accepted[b] = accepted
        q = target_probs[b, accepted]
        # (q - p)(t) / N(t) per token, then its sum over each group: [Q_c - P_c]_+ (P_c = 0 at the bonus
        # slot). q - p in float32 as the torch ops form it, so that singleton groups draw what they draw.
        if accepted < gamma:
            p = draft_probs[b, accepted]
            for t in range(vocab):
                per_token[t] = (q[t] - p[t]) * inv_owners[t]
        else:
            for t in range(vocab):
                per_token[t] = q[t] * inv_owners[t]
        total = 0.0
        for k in range(num_groups):
            mass = 0.0
            for j in range(g_indptr[k], g_indptr[k + 1]):
                mass += per_token[g_members[j]]
            residual[k] = max(mass, 0.0)
            total += residual[k]
        if total <= 0.0:  # P_c == Q_c up to rounding (rejection had probability ~0): draw from Q_c
            for k in range(num_groups):
                residual[k] = _group_mass(q, g_indptr, g_members, member_weight, k)
        group = draw_index(residual, u_emit[b])
        start, end = g_indptr[group], g_indptr[group + 1]
        for j in range(start, end):
            inside[j - start] = q[g_members[j]] * member_weight[j]
        tokens[b, accepted] = g_members[start + draw_index(inside[: end - start], u_token[b])]
        if accepted < gamma:
            groups[b, accepted] = group


def group_verify_compiled(layout: GroupLayout, draft_tokens: torch.Tensor, draft_probs: torch.Tensor,
                          target_probs: torch.Tensor, u: VerifyUniforms) -> Verdict:
    b, g = draft_tokens.shape
    tokens = torch.empty(b, g + 1, dtype=torch.long)
    groups = torch.empty(b, g + 1, dtype=torch.long)
    num_accepted = torch.empty(b, dtype=torch.long)
    _verify_rows(draft_tokens.long().contiguous().numpy(), draft_probs.float().contiguous().numpy(),
                 target_probs.float().contiguous().numpy(), u.accept.numpy(), u.emit.numpy(), u.token.numpy(),
                 *layout.arrays(), tokens.numpy(), groups.numpy(), num_accepted.numpy())
    return Verdict(tokens, num_accepted, groups)


GROUP_VERIFY = Twin(torch=group_verify_torch, compiled=group_verify_compiled)


# ---- the token-level verify -------------------------------------------------------------------------------
def ratio_test(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
               u: torch.Tensor, bias: float = 0.0) -> torch.Tensor:
    """Bool[B, γ]: u < min(1, q(x)/p(x)) + bias, written as (u - bias)·p(x) < q(x) (no division; a draft
    token with p(x) = 0 is accepted iff q(x) > 0)."""
    p_x = token_probs(draft_probs, draft_tokens).double()  # [B, γ]
    q_x = token_probs(target_probs[:, :-1], draft_tokens).double()
    return (u - bias) * p_x < q_x


def token_verify_torch(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                       u: VerifyUniforms) -> Verdict:
    accepted = ratio_test(draft_tokens, draft_probs, target_probs, u.accept)
    return token_level_verdict(draft_tokens, draft_probs, target_probs, accepted, u.emit)


def token_verify_compiled(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                          u: VerifyUniforms) -> Verdict:
    # a singleton group's one member is drawn whatever its uniform: the emission's serves
    singletons = VerifyUniforms(u.accept, u.emit, u.emit)
    layout = singleton_layout(draft_probs.shape[-1])
    v = group_verify_compiled(layout, draft_tokens, draft_probs, target_probs, singletons)
    return Verdict(v.tokens, v.num_accepted, lambda: torch.full_like(v.tokens, -1))


TOKEN_VERIFY = Twin(torch=token_verify_torch, compiled=token_verify_compiled)


# ---- block verification ------------------------------------------------------------------------------------
# The torch steps, also run over ASG group labels (X = groups) by engine/acceptance/pcg_block.py.
def running_weights(target_mass: torch.Tensor, draft_mass: torch.Tensor) -> torch.Tensor:
    """w [B, γ+1] (float64) from the drafts' target and draft masses [B, γ]: w_0 = 1, w_{j+1} = min(w_j ·
    target_mass_j / draft_mass_j, 1). A draft mass of 0 (a draft the draft could not have made) keeps any
    positive weight at 1, as the ratio test accepts such a token iff its target mass is positive."""
    q, p = target_mass.double(), draft_mass.double()
    weights = [torch.ones_like(q[:, 0])]
    for j in range(q.shape[1]):
        scaled = weights[-1] * q[:, j]
        weights.append(torch.where(scaled >= p[:, j], 1.0, scaled / p[:, j].clamp(min=1e-300)) * (scaled > 0))
    return torch.stack(weights, dim=1)


def weighted_excess(weights: torch.Tensor, target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """w_j q_j - p_j at every position, [B, γ+1, X] float32 (p = 0 at the bonus slot j = γ), from
    weights [B, γ+1], target [B, γ+1, X] and draft [B, γ, X] (X: tokens, or groups for pcg-block)."""
    excess = target.float() * weights[:, :, None].float()
    excess[:, :-1] -= draft.float()
    return excess


def stop_position(weights: torch.Tensor, excess: torch.Tensor, eta: torch.Tensor) -> torch.Tensor:
    """τ Long[B]: the last j in 1..γ with eta_{j-1} < h_j (0 if none), from weights [B, γ+1], the weighted
    excess [B, γ+1, X] and uniforms eta Float64[B, γ]. The tests are written without division, so that
    h_j = 0/0 (w_j = 1 with p_j = q_j: nothing left to draw there) marks nothing."""
    g = eta.shape[1]
    if g == 0:
        return torch.zeros(eta.shape[0], dtype=torch.long, device=eta.device)
    mass = excess[:, 1:g].clamp(min=0.0).sum(-1).double()  # r_j for j = 1..γ-1: [B, γ-1]
    inner = eta[:, :g - 1] * (mass + 1.0 - weights[:, 1:g]) < mass  # η < r / (r + 1 - w)
    marked = torch.cat([inner, (eta[:, g - 1] < weights[:, g])[:, None]], dim=1)  # [B, γ]
    return (marked.long() * torch.arange(1, g + 1, device=eta.device)).amax(dim=1)


def residual_rows(excess: torch.Tensor, target: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """[w_τ q_τ - p_τ]_+ of each row, [B, X] float32, or q_τ where that vanishes (only through rounding: a
    position with no residual mass is never marked, and τ = 0 has mass unless p_0 = q_0, which marks a
    later position surely)."""
    rows = torch.arange(excess.shape[0], device=excess.device)
    return target_where_empty(excess[rows, tau].clamp_(min=0.0), target, tau)


def block_verify_torch(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                       u: VerifyUniforms) -> Verdict:
    g = draft_tokens.shape[1]
    weights = running_weights(token_probs(target_probs[:, :g], draft_tokens),
                              token_probs(draft_probs, draft_tokens))  # [B, γ+1]
    excess = weighted_excess(weights, target_probs, draft_probs)  # [B, γ+1, V]
    tau = stop_position(weights, excess, u.accept)
    return assemble(draft_tokens, tau, sample_rows(residual_rows(excess, target_probs, tau), None, u=u.emit))


@cpu_kernel()
def _next_weight(w: float, q_x: float, p_x: float) -> float:
    """Block verification's running weight min(w·q(x)/p(x), 1) (0 where w·q(x) is 0)."""
    scaled = w * q_x
    return 0.0 if scaled <= 0.0 else (1.0 if scaled >= p_x else scaled / p_x)


@cpu_kernel()
def _excess_mass(q: np.ndarray, p: np.ndarray, w: float) -> float:
    """Σ max(w·q - p, 0) over float32 q, p, formed in float32 as the torch ops form it, summed in float64."""
    w32 = np.float32(w)
    mass = 0.0
    for t in range(q.shape[0]):
        excess = q[t] * w32 - p[t]
        if excess > 0:
            mass += excess
    return mass


@cpu_kernel()
def _block_residual(q: np.ndarray, p: np.ndarray, w: float, subtract: bool, out: np.ndarray) -> None:
    """out = max(w·q - p, 0) (p left out where not `subtract`: the bonus slot); q itself where that is all
    zero, which happens only through rounding (see residual_rows)."""
    w32 = np.float32(w)
    total = 0.0
    for t in range(q.shape[0]):
        excess = q[t] * w32
        if subtract:
            excess = excess - p[t]
        out[t] = excess if excess > 0 else 0.0
        total += out[t]
    if total <= 0.0:
        for t in range(q.shape[0]):
            out[t] = q[t]


@cpu_kernel()
def _stops_at(u: float, mass: float, w: float, j: int, gamma: int) -> bool:
    """Whether the block's stop moves to j+1 (or to γ at the last position), given the uniform u, the
    excess mass at j+1 and the running weight w after x_{j+1}: probability r / (r + 1 - w), resp. w."""
    if j + 1 < gamma:
        return u * (mass + 1.0 - w) < mass
    return u < w


@cpu_kernel("void(int64[:, ::1], float32[:, :, ::1], float32[:, :, ::1], float64[:, ::1], float64[::1], "
            "int64[:, ::1], int64[::1])")
def _block_rows(draft_tokens, draft_probs, target_probs, u_accept, u_emit, tokens, num_accepted):
    """Fills tokens [B, γ+1] (the kept drafts, the emitted token, -1 after) and num_accepted [B] = τ. The
    weighted excess w·q - p is formed in float32 as the torch ops form it (its masses summed in float64)."""
    b_rows, gamma = draft_tokens.shape
    vocab = target_probs.shape[2]
    weights = np.empty(gamma + 1, dtype=np.float64)
    residual = np.empty(vocab, dtype=np.float64)
    for b in range(b_rows):
        w = 1.0
        weights[0] = 1.0
        tau = 0
        for j in range(gamma):
            x = draft_tokens[b, j]
            w = _next_weight(w, np.float64(target_probs[b, j, x]), np.float64(draft_probs[b, j, x]))
            weights[j + 1] = w
            mass = _excess_mass(target_probs[b, j + 1], draft_probs[b, j + 1], w) if j + 1 < gamma else 0.0
            if _stops_at(u_accept[b, j], mass, w, j, gamma):
                tau = j + 1
        _block_residual(target_probs[b, tau], draft_probs[b, min(tau, gamma - 1)], weights[tau], tau < gamma,
                        residual)
        tokens[b, :] = -1
        for j in range(tau):
            tokens[b, j] = draft_tokens[b, j]
        tokens[b, tau] = draw_index(residual, u_emit[b])
        num_accepted[b] = tau


def block_verify_compiled(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                          u: VerifyUniforms) -> Verdict:
    b, g = draft_tokens.shape
    tokens = torch.empty(b, g + 1, dtype=torch.long)
    num_accepted = torch.empty(b, dtype=torch.long)
    _block_rows(draft_tokens.long().contiguous().numpy(), draft_probs.float().contiguous().numpy(),
                target_probs.float().contiguous().numpy(), u.accept.numpy(), u.emit.numpy(), tokens.numpy(),
                num_accepted.numpy())
    return Verdict(tokens, num_accepted, lambda: torch.full_like(tokens, -1))


BLOCK_VERIFY = Twin(torch=block_verify_torch, compiled=block_verify_compiled)


def verify_tokens(op: Twin, ops: Ops | None, draft_tokens: torch.Tensor, draft_probs: torch.Tensor,
                  target_probs: torch.Tensor, generator: torch.Generator | None) -> Verdict:
    """A token-level verify (TOKEN_VERIFY, BLOCK_VERIFY) with its uniforms drawn in the one place, by the
    form of `op` that `ops` picks (None: the one that applies to the tensors)."""
    check_shapes(draft_tokens, draft_probs, target_probs)
    b, g = draft_tokens.shape
    u = VerifyUniforms.draw(generator, b, g, draft_probs.device)
    return Ops.given_or_for(ops, draft_probs).form(op)(draft_tokens, draft_probs, target_probs, u)


# ---- block verification over ASG group labels (pcg-block, engine/acceptance/pcg_block.py) ----------------
@cpu_kernel("void(float32[::1], int64[::1], int64[::1], float64[::1], float32[::1])")
def _all_group_masses(probs, g_indptr, g_members, member_weight, out):
    """out[k] = Σ_{t ∈ G_k} probs[t] / N(t) for every group, rounded to float32 as the torch ops' masses."""
    for k in range(g_indptr.shape[0] - 1):
        out[k] = np.float32(_group_mass(probs, g_indptr, g_members, member_weight, k))


@cpu_kernel("void(int64[:, ::1], float32[:, :, ::1], float32[:, :, ::1], float64[:, ::1], float64[::1], "
            "float64[::1], int64[::1], int64[::1], float64[::1], int64[::1], int64[::1], float64[::1], "
            "int64[:, ::1], int64[:, ::1], int64[::1])")
def _block_group_rows(draft_tokens, draft_probs, target_probs, u_accept, u_emit, u_token,
                      g_indptr, g_members, member_weight, t_indptr, t_groups, inv_owners, tokens, groups,
                      num_accepted):
    """pcg-block per row (engine/acceptance/pcg_block.py): fills tokens and groups [B, γ+1] as `assemble`
    lays them out, and num_accepted [B] = τ. The weighted excess w·Q_c - P_c in float32 as the torch ops
    form it (so that over singleton groups it is block's loop draw for draw)."""
    b_rows, gamma = draft_tokens.shape
    num_groups = g_indptr.shape[0] - 1
    p_c = np.empty(num_groups, dtype=np.float32)
    q_c = np.empty(num_groups, dtype=np.float32)
    residual = np.empty(num_groups, dtype=np.float64)
    inside = np.empty(g_members.shape[0], dtype=np.float64)
    weights = np.empty(gamma + 1, dtype=np.float64)
    labels = np.empty(gamma, dtype=np.int64)
    for b in range(b_rows):
        w = 1.0
        weights[0] = 1.0
        tau = 0
        for j in range(gamma):
            x = draft_tokens[b, j]
            n = t_indptr[x + 1] - t_indptr[x]
            scaled_u = u_accept[b, j] * n
            slot = min(np.floor(scaled_u), n - 1.0)  # u·N(t) can round up to N(t)
            k = t_groups[t_indptr[x] + np.int64(slot)]
            eta = scaled_u - slot
            labels[j] = k
            p_k = np.float32(_group_mass(draft_probs[b, j], g_indptr, g_members, member_weight, k))
            q_k = np.float32(_group_mass(target_probs[b, j], g_indptr, g_members, member_weight, k))
            w = _next_weight(w, np.float64(q_k), np.float64(p_k))
            weights[j + 1] = w
            mass = 0.0
            if j + 1 < gamma:  # r over all groups
                _all_group_masses(draft_probs[b, j + 1], g_indptr, g_members, member_weight, p_c)
                _all_group_masses(target_probs[b, j + 1], g_indptr, g_members, member_weight, q_c)
                mass = _excess_mass(q_c, p_c, w)
            if _stops_at(eta, mass, w, j, gamma):
                tau = j + 1
        _all_group_masses(target_probs[b, tau], g_indptr, g_members, member_weight, q_c)
        if tau < gamma:
            _all_group_masses(draft_probs[b, tau], g_indptr, g_members, member_weight, p_c)
        else:
            p_c[:] = 0.0
        _block_residual(q_c, p_c, weights[tau], True, residual)
        group = draw_index(residual, u_emit[b])
        # the token inside: p's members where P_c > 0 before the bonus slot, else q's
        source = draft_probs[b, tau] if tau < gamma and p_c[group] > 0 else target_probs[b, tau]
        start, end = g_indptr[group], g_indptr[group + 1]
        for m in range(start, end):
            inside[m - start] = source[g_members[m]] * member_weight[m]
        tokens[b, :] = -1
        groups[b, :] = -1
        for j in range(tau):
            tokens[b, j] = draft_tokens[b, j]
            groups[b, j] = labels[j]
        tokens[b, tau] = g_members[start + draw_index(inside[: end - start], u_token[b])]
        if tau < gamma:
            groups[b, tau] = group
        num_accepted[b] = tau


def block_group_verify_compiled(layout: GroupLayout, draft_tokens: torch.Tensor, draft_probs: torch.Tensor,
                                target_probs: torch.Tensor, u: VerifyUniforms) -> Verdict:
    b, g = draft_tokens.shape
    tokens = torch.empty(b, g + 1, dtype=torch.long)
    groups = torch.empty(b, g + 1, dtype=torch.long)
    num_accepted = torch.empty(b, dtype=torch.long)
    _block_group_rows(draft_tokens.long().contiguous().numpy(), draft_probs.float().contiguous().numpy(),
                      target_probs.float().contiguous().numpy(), u.accept.numpy(), u.emit.numpy(),
                      u.token.numpy(), *layout.arrays(), tokens.numpy(), groups.numpy(), num_accepted.numpy())
    return Verdict(tokens, num_accepted, groups)


def block_group_verify_torch(layout: GroupLayout, draft_tokens: torch.Tensor, draft_probs: torch.Tensor,
                             target_probs: torch.Tensor, u: VerifyUniforms) -> Verdict:
    b, g = draft_tokens.shape
    table, device = layout.table, draft_probs.device
    labels, eta = table.draw_label(draft_tokens, u.accept)  # K_j ~ w_{·,x_j}; eta independent of K
    draft_c = table.coarse(draft_probs.float())  # P_c [B, γ, M]
    target_c = table.coarse(target_probs.float())  # Q_c [B, γ+1, M]
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


BLOCK_GROUP_VERIFY = Twin(torch=block_group_verify_torch, compiled=block_group_verify_compiled)
