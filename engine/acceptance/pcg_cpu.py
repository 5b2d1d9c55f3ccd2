"""PCG's verify for small ASG tables as one compiled CPU loop (numba), for tensors on the CPU.

At the demo vocabulary (1,200 tokens, 7,099 memberships) the arithmetic of a verify is a few thousand
multiply-adds, while the torch-op version (`PCGRule._verify_small`, which CUDA and any other device run)
issues ~60 small ops at 3-5 µs each: on a CPU a verify costs its op count. This loop does the same math
with the same uniforms, so the two give the same tokens except where a uniform lands within rounding of a
cumulative-sum step (the torch version sums the coarse residual in float32, this loop in float64; with
singleton groups there is nothing to sum and the two agree exactly).

Per row b (q = target, p = draft, w_{k,t} = 1/N(t)):
  for i < γ: K_i = the ⌊u_i·N(x_i)⌋-th group of S(x_i); accept while frac(u_i·N(x_i))·P_c(G_K) < Q_c(G_K);
  at the emission position e = accepted count: group ~ [Q_c - P_c]_+ over all groups (P_c = 0 at the bonus
  slot e = γ; Q_c if the residual vanishes), token ~ q(t)·w_{k,t} inside the group.
Compiled when a PCGRule is built (about a second in a fresh process), cached on disk by numba (next to
this file, or in the user's cache directory when that is read-only).
"""

from __future__ import annotations

import numpy as np
import torch
from pcgtts.asg_tables.table import ASGTable
from pcgtts.engine.acceptance.sampling import uniform
from pcgtts.engine.cpu_kernel import cpu_kernel, draw_index


@cpu_kernel()
def _group_mass(probs: np.ndarray, g_indptr: np.ndarray, g_members: np.ndarray, member_weight: np.ndarray,
                k: int) -> float:
    """Σ_{t ∈ G_k} probs[t] / N(t) (float64)."""
    mass = 0.0
    for j in range(g_indptr[k], g_indptr[k + 1]):
        mass += probs[g_members[j]] * member_weight[j]
    return mass


@cpu_kernel()
def _verify_rows(draft_tokens, draft_probs, target_probs, u_accept, u_emit, u_token,
                 g_indptr, g_members, member_weight, t_indptr, t_groups, inv_owners, tokens, groups,
                 num_accepted):
    """Fills tokens [B, γ+1] and groups [B, γ+1] as `assemble` lays them out (accepted prefix, the emitted
    token, -1 after; groups: the accepted labels, the residual's group after a rejection, -1 for the bonus
    token and padding), and num_accepted [B]. draft_tokens Long[B, γ]; draft_probs Float32[B, γ, V];
    target_probs Float32[B, γ+1, V]; u_accept Float64[B, γ], u_emit and u_token Float64[B];
    member_weight Float64[nnz]: 1/N(t) of each membership of g_members; inv_owners Float64[V]: 1/N(t)."""
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


class CompiledPCG:
    """The compiled verify over one table: its CSR arrays as contiguous numpy views, made once."""

    def __init__(self, table: ASGTable):
        self.table = table
        self._arrays = (
            table._g_indptr.contiguous().numpy(),
            table._g_members.contiguous().numpy(),
            table.inv_owners[table._g_members].contiguous().numpy(),  # 1/N(t) per membership
            table._t_indptr.contiguous().numpy(),
            table._t_groups.contiguous().numpy(),
            table.inv_owners.contiguous().numpy(),
        )
        # one row of one draft token: compiles the loop (or loads it from the cache) before any request
        one = torch.full((1, 2, table.vocab_size), 1.0 / table.vocab_size)
        self.verify(torch.zeros(1, 1, dtype=torch.long), one[:, :1], one, torch.Generator().manual_seed(0))

    def verify(self, draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
               generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens Long[B, γ+1], groups Long[B, γ+1], num_accepted Long[B]) as in `Verdict`, drawing from
        `generator` what `PCGRule._verify_small` draws, in the same order: uniforms [B, γ], [B], [B]."""
        b, g = draft_tokens.shape
        device = draft_probs.device
        u_accept = uniform((b, g), generator, device)
        u_emit = uniform((b,), generator, device)
        u_token = uniform((b,), generator, device)
        tokens = torch.empty(b, g + 1, dtype=torch.long)
        groups = torch.empty(b, g + 1, dtype=torch.long)
        num_accepted = torch.empty(b, dtype=torch.long)
        _verify_rows(
            draft_tokens.long().contiguous().numpy(),
            draft_probs.float().contiguous().numpy(),
            target_probs.float().contiguous().numpy(),
            u_accept.numpy(), u_emit.numpy(), u_token.numpy(),
            *self._arrays,
            tokens.numpy(), groups.numpy(), num_accepted.numpy(),
        )
        return tokens, groups, num_accepted
