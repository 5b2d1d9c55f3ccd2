"""One speculative step over a token tree: k branches of γ drafts under each row's last token.

The feature head proposes k candidates for the first draft position, drawn without replacement from its
distribution p_1 (at token level for exact, at ASG-group level for pcg: engine/acceptance/tree.py), and
continues each candidate into a chain of its own, to γ drafts per branch. The target scores the whole tree
in one forward: [last token, branch 0, ..., branch k-1] written at cache indices n-1 .. n-1+kγ, a branch's
j-th draft at position n-1+j, attending to the row's keys and its own branch's only (engine/attention.py
TreeLayout). Verification:
  1. the candidates, by recursive rejection sampling over them (tree.verify_siblings): the emitted first
     token (or group label) is distributed exactly as the target's;
  2. the accepted candidate's branch from its second draft on, by the row's own rule, as a chain of γ-1
     drafts (q after the candidate is its first target distribution); no candidate accepted: the token
     drawn in 1. ends the step.
Rows whose rule has no tree form (block verification and the relaxed rules), or that verify a single
draft, verify branch 0 alone as the chain it is. After the verdict the accepted branch's K/V moves to the
cache indices a chain's would have (ModelRunner.move_kv) and both caches roll back as after a chain.
Every row's generator gives the same number of draws per step whatever it accepts, as in a chain step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from pcgtts.engine.acceptance.tree import draw_siblings, verify_siblings
from pcgtts.engine.attention import TreeLayout
from pcgtts.engine.ops.verify import singleton_layout
from pcgtts.engine.sampling import BatchSampler
from pcgtts.engine.spec_decode import SpeculativeDecoder, StepResult

if TYPE_CHECKING:
    from pcgtts.engine.sequence import Sequence


class TreeDecoder(SpeculativeDecoder):
    """A SpeculativeDecoder whose speculative steps draft a token tree of `branches` (k ≥ 2) branches of γ
    with its feature head; target-only and split steps are the chain decoder's."""

    def __init__(self, *args, branches: int, **kwargs):
        super().__init__(*args, **kwargs)
        if self.head is None or branches < 2:
            raise ValueError("a token tree needs a feature-head draft and k ≥ 2 branches")
        self.branches = branches

    def _speculate(self, seqs: list[Sequence], sampler: BatchSampler, g: int) -> StepResult:
        return speculate_tree(self, seqs, sampler, g)


def speculate_tree(dec: TreeDecoder, seqs: list[Sequence], sampler: BatchSampler, g: int) -> StepResult:
    k, dev, v = dec.branches, dec.device, dec.vocab_size
    b = len(seqs)
    lengths = [s.length for s in seqs]
    caps = [min(g, s.params.num_speculative_tokens or g) for s in seqs]  # each row's own γ
    layouts = [s.rule.sibling_layout(v, dev) if cap > 1 else None for s, cap in zip(seqs, caps, strict=True)]

    # 1. draft: the first position's k candidates, then each branch's chain ([B*k] rows, row b*k + branch)
    first = dec.head(torch.stack([s.draft_state for s in seqs]), torch.tensor(
        [s.token_ids[-1] for s in seqs], device=dev))  # [B, d]
    p_first = sampler.probs(dec.target.logits(first[:, None]))[:, 0]  # [B, V]
    u = torch.stack([sampler.uniforms() for _ in range(k)], dim=1)  # [B, k]
    siblings = torch.empty(b, k, dtype=torch.long, device=dev)
    sibling_probs = torch.empty(b, k, v, device=dev)
    by_layout = _by_layout(layouts, dev)
    for layout, rows in by_layout:  # (a row without a tree form needs branch 0 only)
        siblings[rows], sibling_probs[rows] = draw_siblings(layout or singleton_layout(v), p_first[rows],
                                                            u[rows])
    wide = BatchSampler([s for s in seqs for _ in range(k)], v, dev, dec.shared_generator, dec.ops)
    drafts = torch.zeros(b * k, g, dtype=torch.long, device=dev)  # [B*k, γ]
    drafts[:, 0] = siblings.clamp(min=0).flatten()  # an absent candidate (-1) is never verified
    draft_probs = torch.empty(b * k, g, v, device=dev)
    draft_probs[:, 0] = sibling_probs.flatten(0, 1)
    states = first.repeat_interleave(k, dim=0)  # [B*k, d]
    for j in range(1, g):
        states = dec.head(states, drafts[:, j - 1])
        logits = dec.target.logits(states[:, None])
        drafts[:, j] = wide.probs_and_draw(logits, drafts[:, :j], offset=j, out=draft_probs[:, j])[1]

    # 2. the target scores the tree in one forward
    tree, positions = TreeLayout.of(torch.tensor(lengths, device=dev), k, g)
    ids = torch.cat([torch.tensor([[s.token_ids[-1]] for s in seqs], device=dev), drafts.view(b, k * g)], 1)
    t_states = [s.target for s in seqs]
    tables = dec.target.block_tables(t_states, max(lengths) + k * g)
    hidden = dec.target.forward(ids, positions, dec._all_valid(b, 1 + k * g), tables, states=t_states,
                                tree=tree)  # [B, 1+kγ, d]
    # each branch as a chain: [last token, its drafts] -> q over [B*k, γ+1, V]
    columns = torch.cat([torch.zeros(k, 1, dtype=torch.long, device=dev),
                         1 + torch.arange(k * g, device=dev).view(k, g)], dim=1)  # [k, γ+1]
    branch_hidden = hidden[:, columns].flatten(0, 1)  # [B*k, γ+1, d]
    target_probs = wide.probs(dec.target.logits(branch_hidden), drafts, offset=0)

    # 3. verify: the candidates, then the chosen branch's chain
    u_verify = torch.stack([sampler.uniforms() for _ in range(k + 2)], dim=1)  # [B, k+2]
    chosen = torch.zeros(b, dtype=torch.long, device=dev)  # rows without a tree form: branch 0, whole
    first_token = torch.zeros(b, dtype=torch.long, device=dev)
    tree_rows = torch.zeros(b, dtype=torch.bool, device=dev)
    root_q = target_probs.view(b, k, g + 1, v)[:, 0, 0]  # [B, V] (every branch's column 0 is the same)
    for layout, rows in by_layout:
        if layout is not None:
            verdict = verify_siblings(layout, siblings[rows], sibling_probs[rows], root_q[rows],
                                      u_verify[rows])
            chosen[rows], first_token[rows], tree_rows[rows] = verdict.chosen, verdict.token, True
    pick = torch.arange(b, device=dev) * k + chosen.clamp(min=0)  # [B] each row's branch among the B*k
    shift = tree_rows.long()  # a tree row's chain starts at its branch's second draft
    cols = torch.arange(g + 1, device=dev)[None, :] + shift[:, None]  # [B, γ+1]
    chain_drafts = drafts[pick].gather(1, cols[:, :g].clamp(max=g - 1))
    chain_probs = draft_probs[pick][torch.arange(b, device=dev)[:, None], cols[:, :g].clamp(max=g - 1)]
    chain_q = target_probs[pick][torch.arange(b, device=dev)[:, None], cols.clamp(max=g)]
    chain_gammas = [cap - int(t) for cap, t in zip(caps, shift.tolist(), strict=True)]
    tokens, accepted = dec._verify(seqs, chain_gammas, sampler, chain_drafts, chain_probs, chain_q)

    emitted, num_accepted, last_column = [], [], []
    for i, (row, m) in enumerate(zip(tokens.tolist(), accepted.tolist(), strict=True)):
        c = int(chosen[i])
        if not tree_rows[i]:  # branch 0 verified as a chain
            emitted.append(row[:m + 1])
            last_column.append(m)  # the column that produced its last token: m drafts in
        elif c < 0:  # no candidate accepted: the residual's token alone
            emitted.append([int(first_token[i])])
            last_column.append(0)
        else:
            emitted.append([int(siblings[i, c])] + row[:m + 1])
            last_column.append(1 + c * g + m)
        num_accepted.append(len(emitted[-1]) - 1)

    # 4. the head's next state, the accepted branch's K/V where a chain's would be, roll back
    dec._keep_states(seqs, hidden[torch.arange(b, device=dev), torch.tensor(last_column, device=dev)],
                     num_accepted)
    for i, (s, a) in enumerate(zip(seqs, num_accepted, strict=True)):
        c = max(int(chosen[i]), 0)
        s.target.num_computed = s.length + k * g
        if a and c:  # branch c's first a drafts, at n + c·γ .., move to n ..
            dec.target.move_kv(s.target, s.length + c * g, s.length, a)
        s.target.roll_back(dec.target.blocks, s.length + a)
    return StepResult(tokens=emitted, num_accepted=num_accepted, num_drafted=caps)


def _by_layout(layouts: list, device: torch.device) -> list[tuple[object, torch.Tensor]]:
    """(layout, Long[n] rows) for each distinct layout (None: rows without a tree form)."""
    groups: dict[int, tuple[object, list[int]]] = {}
    for i, layout in enumerate(layouts):
        groups.setdefault(id(layout), (layout, []))[1].append(i)
    return [(layout, torch.tensor(members, device=device)) for layout, members in groups.values()]
