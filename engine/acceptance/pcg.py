"""PCG: Principled Coarse-Grained acceptance (arXiv 2511.13732, Algorithm 1) over an ASG table.

Per draft position i (q = target, p = draft, equal-split weights w_{k,t} = 1/N(t)):
  1. label K_i ~ w_{·,x_i} over the groups holding the draft token, so Pr(K_i = k) = P_c(G_k);
  2. accept with min(1, Q_c(G_K)/P_c(G_K)), keeping x_i itself as the group's representative;
  3. at the first rejection draw a group K' from R_c ∝ [Q_c - P_c]_+ and a token from the q-conditional
     w_{K',t} q(t)/Q_c(G_K'). Thinning does both at once: y ~ q, K' ~ w_{·,y}, keep (y, K') with
     probability 1 - P_c(G_K')/Q_c(G_K'). After `thinning_rounds` rounds of `thinning_trials` trials the
     rows still unresolved are sampled exactly by enumerating Q_c, P_c with `ASGTable.coarse` (rare), so
     the output is exact either way;
  4. after γ acceptances the bonus token is a plain sample of q_{γ+1} (group label -1).
The emitted label is distributed exactly as Q_c at every step; within a group the accepted token follows p.
Small tables verify on the CPU with the compiled loop of pcg_cpu.py; elsewhere (CUDA) with torch ops.
"""

from __future__ import annotations

import torch
from pcgtts.asg_tables.table import ASGTable
from pcgtts.engine.acceptance.base import (
    AcceptanceRule,
    assemble,
    check_shapes,
    count_accepted,
    draft_rows_or_zero,
    rows_at,
    select_rows,
)
from pcgtts.engine.acceptance.sampling import sample_rows, sample_segments, uniform
from pcgtts.engine.acceptance.verdict import Verdict
from pcgtts.engine.cpu_kernel import compiled_applies

# Up to this vocabulary size, enumerated PCG works on padded member matrices ([M, largest group]): fewer ops
# per step; beyond it, ragged segment sums and sparse products cost less memory.
DENSE_COARSE_MAX_V = 16384


class PCGRule(AcceptanceRule):
    name = "pcg"
    uses_asg_table = True

    def __init__(self, table: ASGTable | str, thinning_trials: int = 4, thinning_rounds: int = 8,
                 residual: str = "auto", enumerate_max_nnz: int = 1 << 16, compiled: bool = True):
        """residual: how a rejected (or bonus) position's token is drawn, both exact in distribution:
        "thinning" (the paper's: O(|G|) per trial, for large tables), "enumerate" (Q_c, P_c over all groups
        with `coarse`: O(nnz) per row, cheap for small tables; with an all-singleton table whose group k is
        token k it consumes the generator exactly as `exact` does, so the two give identical tokens), or
        "auto" (enumerate when the table has at most max(`enumerate_max_nnz`, 2·vocab_size) memberships:
        then enumeration costs about what the token-level rules' O(V) residual does, while for Llasa-size
        tables with real groups it is 5-10x slower than thinning; see bench/verify_speed.py).
        compiled: verify small tables on CPU tensors with the compiled loop of pcg_cpu.py (same draws, same
        verdict up to float rounding); False keeps the torch ops every device runs."""
        self.table = ASGTable.load(table) if isinstance(table, str) else table
        self.thinning_trials = int(thinning_trials)
        self.thinning_rounds = int(thinning_rounds)
        if residual not in ("auto", "thinning", "enumerate"):
            raise ValueError(f"residual must be auto, thinning or enumerate, not {residual!r}")
        if residual == "auto":
            small = self.table.group_members.numel() <= max(enumerate_max_nnz, 2 * self.table.vocab_size)
            residual = "enumerate" if small else "thinning"
        self.residual = residual
        self.compiled = bool(compiled)
        self._compiled_for: tuple[ASGTable, object] | None = None
        if self._uses_compiled(self.table):
            self._compiled(self.table)  # compile now (engine start-up), not in the first request
        # counters for benchmarks: rejections handled, thinning trials spent, rows that needed the fallback
        self.stats = {"rejections": 0, "thinning_trials": 0, "fallback_rows": 0}
        self._starts: dict[tuple[int, int, torch.device], torch.Tensor] = {}

    @property
    def row_draws(self) -> bool:
        """Enumeration draws per row; thinning draws per pending row and trial."""
        return self.residual == "enumerate"

    def _table_on(self, device: torch.device) -> ASGTable:
        if self.table.device != device:
            self.table = self.table.to(device)
        return self.table

    def verify(self, draft_tokens, draft_probs, target_probs, generator=None) -> Verdict:
        check_shapes(draft_tokens, draft_probs, target_probs)
        table = self._table_on(draft_probs.device)
        if draft_probs.shape[-1] != table.vocab_size:
            raise ValueError(f"probs over {draft_probs.shape[-1]} tokens, ASG table over {table.vocab_size}")
        if self._uses_compiled(table):
            tokens, groups, num_accepted = self._compiled(table).verify(
                draft_tokens, draft_probs, target_probs, generator)
            return Verdict(tokens, num_accepted, groups)
        b, g = draft_tokens.shape
        device = draft_probs.device
        # The token-level rules' draws (acceptance uniforms, then one emission uniform per row), so that with
        # singleton groups PCG replays `exact` draw for draw.
        u_accept = uniform((b, g), generator, device)
        u_emit = uniform((b,), generator, device)
        # 1-2. group labels and the coarse acceptance test, for all B·γ positions at once; each position's
        # uniform gives both its label and its test's uniform
        labels, u_test = table.draw_label(draft_tokens, u_accept)  # [B, γ] each
        if self._small(table):
            return self._verify_small(table, draft_tokens, draft_probs, target_probs, labels, u_test,
                                      u_emit, generator)
        bi = torch.arange(b, device=device).repeat_interleave(g)
        pi = torch.arange(g, device=device).repeat(b)
        p_c = table.group_mass(draft_probs, (bi, pi), labels.flatten()).view(b, g)
        q_c = table.group_mass(target_probs, (bi, pi), labels.flatten()).view(b, g)
        num_accepted = count_accepted(u_test * p_c < q_c)  # u < Q_c/P_c
        if self.residual == "enumerate":
            last_token, last_group = self._enumerated_emission(
                table, draft_probs, target_probs, num_accepted, u_emit, generator)
            return assemble(draft_tokens, num_accepted, last_token, lambda: (labels, last_group))

        last_token = torch.empty(b, dtype=torch.long, device=device)
        last_group = torch.full((b,), -1, dtype=torch.long, device=device)
        # 4. bonus rows: plain target sample at position γ
        bonus = torch.nonzero(num_accepted == g).flatten()
        if bonus.numel():
            last_token[bonus] = sample_rows(
                select_rows(target_probs, bonus, torch.full_like(bonus, g)), generator, u=u_emit[bonus]
            )
        # 3. rejected rows: group residual at position num_accepted
        rejected = torch.nonzero(num_accepted < g).flatten()
        if rejected.numel():
            pos = num_accepted[rejected]
            tokens, groups = self._sample_group_residual(
                table,
                select_rows(draft_probs, rejected, pos),
                select_rows(target_probs, rejected, pos),
                generator,
            )
            last_token[rejected], last_group[rejected] = tokens, groups
        return assemble(draft_tokens, num_accepted, last_token, lambda: (labels, last_group))

    def _small(self, table: ASGTable) -> bool:
        return self.residual == "enumerate" and table.vocab_size <= DENSE_COARSE_MAX_V

    def _uses_compiled(self, table: ASGTable) -> bool:
        """Whether verify over `table` (on the probabilities' device: verify moves it there) runs the
        compiled loop."""
        return self.compiled and self._small(table) and compiled_applies(table.device, table.vocab_size)

    def _compiled(self, table: ASGTable):
        """The compiled CPU verify for `table`, built once per table (the first build in a process compiles
        the loop, or loads it from numba's disk cache: ~1 s / ~0.2 s)."""
        if self._compiled_for is None or self._compiled_for[0] is not table:
            from pcgtts.engine.acceptance.pcg_cpu import CompiledPCG

            self._compiled_for = (table, CompiledPCG(table))
        return self._compiled_for[1]

    def _verify_small(self, table, draft_tokens, draft_probs, target_probs, labels, u_test, u_emit,
                      generator) -> Verdict:
        """The same verdict for small tables with few ops (at this size a step costs its op count, not its
        arithmetic): the labels' masses from every group's members as one padded matrix, the emission
        residual from one sparse product. Same draws as the general path, so seeds replay it."""
        b, g = draft_tokens.shape
        members_pad, weights_pad = self._padded_groups(table)  # [M, Gmax]
        label_members, label_weights = members_pad[labels], weights_pad[labels]  # [B, γ, Gmax]
        # P_c and Q_c of the labels in one gather over p and q stacked (a few KB at decode sizes)
        both = torch.stack([draft_probs, target_probs[:, :g]])  # [2, B, γ, V]
        members_both = label_members.expand(2, *label_members.shape)
        p_c, q_c = (torch.gather(both, 3, members_both).double() * label_weights).sum(-1)  # [B, γ] each
        num_accepted = count_accepted(u_test * p_c < q_c)
        # emission position n_b: group ~ norm[Q_c - P_c]_+ (P_c = 0 at the bonus slot), token ~ q within it;
        # Q_c - P_c is the coarse-graining of q - p (linear)
        # q - p at every position (p = 0 at the bonus slot), then each row's emission position
        diffs = target_probs.clone()  # [B, γ+1, V] (probs are float32)
        diffs[:, :g] -= draft_probs
        emit_row = self._row_starts(b, g + 1, diffs.device) + num_accepted  # [B] into [B (γ+1)]
        residual = table.coarse(diffs.view(-1, table.vocab_size).index_select(0, emit_row)).clamp_(min=0.0)
        q_emit = target_probs.view(-1, table.vocab_size).index_select(0, emit_row)  # [B, V] q at emission
        totals = residual.sum(-1)
        if float(totals.min()) <= 0:  # P_c == Q_c up to rounding (rejection had probability ~0): use Q_c
            empty = totals <= 0
            residual[empty] = table.coarse(q_emit[empty])
        group = sample_rows(residual, generator, u=u_emit)  # [B]
        members = members_pad[group]  # [B, Gmax]
        weights = torch.gather(q_emit, 1, members).double() * weights_pad[group]
        last_token = torch.gather(members, 1, sample_rows(weights, generator)[:, None])[:, 0]
        return assemble(draft_tokens, num_accepted, last_token,
                        lambda: (labels, torch.where(num_accepted < g, group, -1)))

    def _row_starts(self, rows: int, width: int, device: torch.device) -> torch.Tensor:
        """Long[rows]: 0, width, 2·width, ... (the first flat row of each sequence), made once per shape."""
        key = (rows, width, device)
        if key not in self._starts:
            self._starts[key] = torch.arange(rows, device=device) * width
        return self._starts[key]

    def _padded_groups(self, table: ASGTable) -> tuple[torch.Tensor, torch.Tensor]:
        """Members of every group as rows of one matrix, Long[M, Gmax] (padding: token 0), and their
        weights w_{k,t} = 1/N(t), Float64[M, Gmax] (padding: 0). Built once per table."""
        if getattr(self, "_padded_for", None) is not table:
            sizes = table.group_sizes()
            width = int(sizes.max())
            cols = torch.arange(width, device=sizes.device)
            inside = cols[None, :] < sizes[:, None]  # [M, Gmax]
            last = len(table.group_members) - 1
            index = (table.group_indptr[:-1].long()[:, None] + cols[None, :]).clamp(max=last)
            members = torch.where(inside, table.group_members.long()[index], 0)
            self._padded = (members, torch.where(inside, table.inv_owners[members], 0.0))
            self._padded_for = table
        return self._padded

    def _enumerated_emission(self, table, draft_probs, target_probs, num_accepted, u_emit, generator):
        """(token, group) for every row at its emission position, by enumeration. A bonus row (all γ
        accepted) has no draft there (P_c = 0): its group is drawn from Q_c and its token from the
        q-conditional, which is a plain draw from q; its label is reported as -1 (not a verified group)."""
        g = draft_probs.shape[1]
        q = rows_at(target_probs, num_accepted)  # [B, V] float32
        p = draft_rows_or_zero(draft_probs, num_accepted)  # [B, V], zero on bonus rows
        self.stats["rejections"] += int((num_accepted < g).sum())
        token, group = self._exact_group_residual(table, p, q, generator, u=u_emit, dtype=q.dtype)
        return token, torch.where(num_accepted < g, group, -1)

    def _sample_group_residual(
        self, table: ASGTable, p: torch.Tensor, q: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(token, group) per row of p, q [R, V]: group ~ norm[Q_c - P_c]_+, token ~ w_{K,t} q(t)/Q_c(G_K)."""
        r, device = q.shape[0], q.device
        self.stats["rejections"] += r
        token = torch.full((r,), -1, dtype=torch.long, device=device)
        group = torch.full((r,), -1, dtype=torch.long, device=device)
        pending = torch.arange(r, device=device)
        t = self.thinning_trials
        for _ in range(self.thinning_rounds):
            if pending.numel() == 0:
                break
            n = pending.numel()
            self.stats["thinning_trials"] += n * t
            u = uniform((2, n, t), generator, device)
            y = sample_rows(q if n == r else q[pending], generator, u=u[0])  # [n, T], y ~ q
            k, u_keep = table.draw_label(y, u[1])  # [n, T] each
            rows = pending.repeat_interleave(t)
            q_c = table.group_mass(q, (rows,), k.flatten()).view(n, t)
            p_c = table.group_mass(p, (rows,), k.flatten()).view(n, t)
            ok = u_keep * q_c < q_c - p_c  # keep with probability [Q_c - P_c]_+ / Q_c
            done = ok.any(dim=1)
            first = ok.long().argmax(dim=1)  # first successful trial: trials are i.i.d., so this is exact
            chosen = pending[done]
            token[chosen] = y[done, first[done]]
            group[chosen] = k[done, first[done]]
            pending = pending[~done]
        if pending.numel():
            self.stats["fallback_rows"] += pending.numel()
            token[pending], group[pending] = self._exact_group_residual(
                table, p[pending], q[pending], generator
            )
        return token, group

    @staticmethod
    def _exact_group_residual(
        table: ASGTable, p: torch.Tensor, q: torch.Tensor, generator: torch.Generator | None,
        u: torch.Tensor | None = None, dtype: torch.dtype = torch.float64,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The same draw by enumeration: O(nnz) per row. u: the group draw's uniforms Float64[F] (drawn
        from `generator` when None); dtype: precision of Q_c, P_c (the fallback keeps float64)."""
        q_c, p_c = table.coarse(q.to(dtype)), table.coarse(p.to(dtype))  # [F, M]
        residual = (q_c - p_c).clamp_(min=0.0)
        # A zero residual means P_c == Q_c up to rounding, where rejection has probability ~0; drawing the
        # label from Q_c keeps the draw defined.
        residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, q_c)
        group = sample_rows(residual, generator, u=u)  # [F]
        seg, members = table.segments(group)
        weights = q[seg, members].double() * table.inv_owners[members]
        counts = torch.bincount(seg, minlength=group.shape[0])
        indptr = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
        return members[sample_segments(weights, indptr, generator)], group
