"""PCG: Principled Coarse-Grained acceptance (arXiv 2511.13732, Algorithm 1) over an ASG table.

Per draft position i (q = target, p = draft, equal-split weights w_{k,t} = 1/N(t)):
  1. label K_i ~ w_{·,x_i} over the groups holding the draft token, so Pr(K_i = k) = P_c(G_k);
  2. accept with min(1, Q_c(G_K)/P_c(G_K)), keeping x_i itself as the group's representative;
  3. at the first rejection draw a group K' from R_c ∝ [Q_c - P_c]_+ and a token from the q-conditional
     w_{K',t} q(t)/Q_c(G_K'): by enumerating Q_c, P_c over all groups, or by thinning (y ~ q, K' ~ w_{·,y},
     keep (y, K') with probability 1 - P_c(G_K')/Q_c(G_K'); after `thinning_rounds` rounds of
     `thinning_trials` trials the rows still unresolved are enumerated, so the output is exact either way);
  4. after γ acceptances the bonus token is a plain sample of q_{γ+1} (group label -1).
The emitted label is distributed exactly as Q_c at every step; within a group the accepted token follows p.
The math is engine/ops/verify.py's: the enumerated verify is its GROUP_VERIFY (a compiled loop on CPU, torch
ops elsewhere), thinning its torch steps.
"""

from __future__ import annotations

import torch
from pcgtts.asg_tables.table import ASGTable
from pcgtts.engine.acceptance.base import AcceptanceRule, assemble, check_shapes, count_accepted, select_rows
from pcgtts.engine.acceptance.sampling import VerifyUniforms, sample_rows
from pcgtts.engine.acceptance.verdict import Verdict
from pcgtts.engine.ops import Ops
from pcgtts.engine.ops.verify import GROUP_VERIFY, GroupLayout, group_test, residual_thinning


class PCGRule(AcceptanceRule):
    name = "pcg"
    uses_asg_table = True
    has_compiled_form = True

    def __init__(self, table: ASGTable | str, thinning_trials: int = 4, thinning_rounds: int = 8,
                 residual: str = "auto", enumerate_max_nnz: int = 1 << 16, ops: Ops | None = None):
        """residual: how a rejected (or bonus) position's token is drawn, both exact in distribution:
        "thinning" (the paper's: O(|G|) per trial, for large tables), "enumerate" (Q_c, P_c over all groups
        with `coarse`: O(nnz) per row, cheap for small tables; with an all-singleton table whose group k is
        token k it consumes the generator exactly as `exact` does, so the two give identical tokens), or
        "auto" (enumerate when the table has at most max(`enumerate_max_nnz`, 2·vocab_size) memberships:
        then enumeration costs about what the token-level rules' O(V) residual does, while for Llasa-size
        tables with real groups thinning costs less; bench/verify_speed.py measures both).
        ops: the forms of the enumerated verify (engine/ops); None: the one that applies to each call's
        tensors."""
        self.table = ASGTable.load(table) if isinstance(table, str) else table
        self.thinning_trials = int(thinning_trials)
        self.thinning_rounds = int(thinning_rounds)
        if residual not in ("auto", "thinning", "enumerate"):
            raise ValueError(f"residual must be auto, thinning or enumerate, not {residual!r}")
        if residual == "auto":
            small = self.table.group_members.numel() <= max(enumerate_max_nnz, 2 * self.table.vocab_size)
            residual = "enumerate" if small else "thinning"
        self.residual = residual
        self.ops = ops
        self.layout = GroupLayout(self.table)
        # counters for benchmarks: rejections handled by thinning, trials spent, rows that needed enumeration
        self.stats = {"rejections": 0, "thinning_trials": 0, "fallback_rows": 0}

    @property
    def row_draws(self) -> bool:
        """Enumeration draws per row; thinning draws per pending row and trial."""
        return self.residual == "enumerate"

    def _layout_on(self, device: torch.device) -> GroupLayout:
        if self.table.device != device:
            self.table = self.table.to(device)
            self.layout = GroupLayout(self.table)
        return self.layout

    def sibling_layout(self, vocab_size, device):
        return self._layout_on(device)

    def _checked_layout(self, draft_tokens, draft_probs, target_probs) -> GroupLayout:
        """The table's layout on the tensors' device, once their shapes and vocabulary fit the table."""
        check_shapes(draft_tokens, draft_probs, target_probs)
        vocab = draft_probs.shape[-1]
        if vocab != self.table.vocab_size:
            raise ValueError(f"probs over {vocab} tokens, ASG table over {self.table.vocab_size}")
        return self._layout_on(draft_probs.device)

    def verify(self, draft_tokens, draft_probs, target_probs, generator=None) -> Verdict:
        layout = self._checked_layout(draft_tokens, draft_probs, target_probs)
        b, g = draft_tokens.shape
        u = VerifyUniforms.draw(generator, b, g, draft_probs.device, in_group=self.residual == "enumerate")
        if self.residual == "enumerate":
            verify = Ops.given_or_for(self.ops, draft_probs).form(GROUP_VERIFY)
            return verify(layout, draft_tokens, draft_probs, target_probs, u)
        return self._verify_thinning(layout, draft_tokens, draft_probs, target_probs, u, generator)

    def _verify_thinning(self, layout, draft_tokens, draft_probs, target_probs, u, generator) -> Verdict:
        b, g = draft_tokens.shape
        labels, accepted = group_test(layout, draft_tokens, u.accept, draft_probs, target_probs[:, :g])
        num_accepted = count_accepted(accepted)
        last_token = torch.empty(b, dtype=torch.long, device=draft_probs.device)
        last_group = torch.full((b,), -1, dtype=torch.long, device=draft_probs.device)
        bonus = torch.nonzero(num_accepted == g).flatten()  # a plain target sample at position γ
        if bonus.numel():
            last_token[bonus] = sample_rows(select_rows(target_probs, bonus, torch.full_like(bonus, g)), None,
                                            u=u.emit[bonus])
        rejected = torch.nonzero(num_accepted < g).flatten()  # the group residual at position num_accepted
        if rejected.numel():
            pos = num_accepted[rejected]
            tokens, groups, trials, fallback = residual_thinning(
                layout, select_rows(draft_probs, rejected, pos), select_rows(target_probs, rejected, pos),
                generator, self.thinning_trials, self.thinning_rounds)
            last_token[rejected], last_group[rejected] = tokens, groups
            self.stats["rejections"] += rejected.numel()
            self.stats["thinning_trials"] += trials
            self.stats["fallback_rows"] += fallback
        return assemble(draft_tokens, num_accepted, last_token, lambda: (labels, last_group))
