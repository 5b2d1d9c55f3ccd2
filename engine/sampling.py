"""Logits -> sampling distributions and draws, per row, identical for the draft and the target.

For each row (one sequence) and each scored position the pipeline is:
  repetition penalty (Hugging Face semantics, over prompt + generated + earlier draft tokens)
  -> the request's DecodeConstraint (speech-family structure; sees the penalised logits)
  -> temperature / top-k / top-p via engine.acceptance.logits_to_probs (greedy = one-hot argmax).
The history of position i is everything generated before it, including the draft tokens before it, so the
draft's proposal distribution and the target's verification distribution at the same position are built
from the same history — what acceptance needs to stay exact with respect to the processed target.
"""

from __future__ import annotations

import torch
from pcgtts.engine.acceptance import logits_to_probs
from pcgtts.engine.acceptance.sampling import sample_rows
from pcgtts.engine.acceptance.warp import GREEDY_EPS
from pcgtts.engine.ops import Ops
from pcgtts.engine.ops.softmax_draw import SOFTMAX_DRAW
from pcgtts.engine.sequence import Sequence
from pcgtts.engine.speech.base import DraftedHistories


def presence_of(token_ids: list[int], vocab_size: int, device: torch.device) -> torch.Tensor:
    """Bool[V]: which tokens occur in token_ids."""
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    mask[torch.tensor(token_ids, dtype=torch.long, device=device)] = True
    return mask


class BatchSampler:
    """Sampling state of one step's B rows."""

    def __init__(self, seqs: list[Sequence], vocab_size: int, device: torch.device,
                 shared_generator: torch.Generator, ops: Ops):
        """ops: the forms of the per-step operations (the engine's choice, engine/ops)."""
        self.seqs = seqs
        self.device = device
        self.ops = ops
        params = [s.params for s in seqs]
        self.temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
        self.generators = [s.generator or shared_generator for s in seqs]
        # Rows of plain temperature sampling (no greedy, no top-k, no top-p: the common case): their probs
        # are softmax(logits / T), the very numbers logits_to_probs computes for them.
        plain = [p.temperature > GREEDY_EPS and not 0 < p.top_k < vocab_size and p.top_p >= 1.0
                 for p in params]
        self._temperature_only = all(plain)  # then without logits_to_probs' per-call checks
        self._temperature_col = self.temperature[:, None, None]  # [B, 1, 1]
        # Plain rows draw by softmax-and-draw (engine/ops) whatever the other rows ask for, so that a row's
        # draft probabilities and draw never depend on its batch mates' settings.
        self._plain_rows: torch.Tensor | None = None  # Long[n] of those rows; None when there are none
        if any(plain) and not self._temperature_only:
            self._plain_rows = torch.tensor([b for b, ok in enumerate(plain) if ok], device=device)
        if not self._temperature_only:  # made once per step, used by every probs() call
            self.top_k = torch.tensor([p.top_k for p in params], dtype=torch.long, device=device)
            self.top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
        self.penalty = None
        if any(p.repetition_penalty != 1.0 for p in params):
            self.penalty = torch.tensor([p.repetition_penalty for p in params], device=device)
            for s in seqs:
                if s.presence is None:
                    s.presence = presence_of(s.token_ids, vocab_size, device)
            self.presence = torch.stack([s.presence for s in seqs])  # [B, V]
        # constrained rows by constraint class: each class constrains all its rows at once (apply_rows)
        self.constrained: dict[type, list[int]] = {}
        for b, s in enumerate(seqs):
            if s.params.constraint is not None:
                self.constrained.setdefault(type(s.params.constraint), []).append(b)
        self._row_index = {cls: torch.tensor(rows, device=device) for cls, rows in self.constrained.items()}

    def probs(self, logits: torch.Tensor, drafts: torch.Tensor | None = None,
              offset: int = 0) -> torch.Tensor:
        """logits [B, P, V] -> probs [B, P, V].

        Position i of row b follows the row's tokens plus drafts[b, :offset + i] (drafts: Long[B, J])."""
        logits = self._processed(logits, drafts, offset)
        if self._temperature_only:
            return torch.softmax(logits.float() / self._temperature_col, dim=-1)
        return logits_to_probs(logits, self.temperature, self.top_k, self.top_p)

    def _processed(self, logits: torch.Tensor, drafts: torch.Tensor | None, offset: int) -> torch.Tensor:
        """logits [B, P, V] after the repetition penalty and the decode constraints."""
        if self.penalty is not None:
            logits = self._penalise(logits, drafts, offset)
        if self.constrained:
            logits = self._constrain(logits, drafts, offset)
        return logits

    def probs_and_draw(self, logits: torch.Tensor, drafts: torch.Tensor | None = None, offset: int = 0,
                       out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [B, 1, V] -> (probs [B, V] as `probs` gives them, Long[B]: one draw per row from its own
        generator, as `sample` draws). out: Float32[B, V] to write the probs into (e.g. one position of the
        draft's probability buffer)."""
        logits = self._processed(logits, drafts, offset)[:, 0]  # [B, V]
        u = self.uniforms()  # [B]: one per row, from its own generator
        softmax_draw = self.ops.form(SOFTMAX_DRAW)
        if self._temperature_only:
            return softmax_draw(logits, self.temperature, u, out)
        # mixed: every row by the warps, then the plain rows again by softmax-and-draw (as alone)
        probs = logits_to_probs(logits, self.temperature, self.top_k, self.top_p)  # [B, V]
        tokens = sample_rows(probs, None, u)
        if self._plain_rows is not None:
            rows = self._plain_rows
            probs[rows], tokens[rows] = softmax_draw(logits[rows], self.temperature[rows], u[rows])
        if out is not None:
            probs = out.copy_(probs)
        return probs, tokens

    def _penalise(self, logits: torch.Tensor, drafts: torch.Tensor | None, offset: int) -> torch.Tensor:
        b, p, v = logits.shape
        seen = self.presence[:, None, :].expand(b, p, v)
        num_drafts = 0 if drafts is None else min(drafts.shape[1], offset + p - 1)
        if num_drafts:
            seen = seen.clone()
            for m in range(num_drafts):  # draft m is history for positions i with offset + i > m
                first = max(0, m - offset + 1)
                seen[:, first:].scatter_(-1, drafts[:, m, None, None].expand(b, p - first, 1), True)
        pen = self.penalty[:, None, None]
        penalised = torch.where(logits < 0, logits * pen, logits / pen)
        return torch.where(seen, penalised, logits)

    def _constrain(self, logits: torch.Tensor, drafts: torch.Tensor | None, offset: int) -> torch.Tensor:
        p = logits.shape[1]
        draft_lists = drafts.tolist() if drafts is not None else None
        out = None
        for cls, rows in self.constrained.items():
            histories = [DraftedHistories(self.seqs[b].token_ids, self.seqs[b].prompt_len,
                                          draft_lists[b] if draft_lists is not None else [], offset, p)
                         for b in rows]
            constraints = [self.seqs[b].params.constraint for b in rows]
            if len(rows) == logits.shape[0]:  # every row: no copy of the unconstrained logits
                return cls.apply_rows(constraints, logits, histories, self.ops)
            if out is None:
                out = logits.clone()
            index = self._row_index[cls]
            out[index] = cls.apply_rows(constraints, logits[index], histories, self.ops)
        return out

    def uniforms(self) -> torch.Tensor:
        """Float64[B]: one U[0, 1) per row from that row's generator."""
        draws = [torch.rand(1, generator=g, device=self.device, dtype=torch.float64) for g in self.generators]
        return draws[0] if len(draws) == 1 else torch.cat(draws)

    def sample(self, probs: torch.Tensor) -> torch.Tensor:
        """probs [B, V] -> Long[B], one draw per row from the row's own generator."""
        return sample_rows(probs, None, self.uniforms())
