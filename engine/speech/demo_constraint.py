"""The marker-merge decode constraint of the demo phoneme family.

The model decides WHEN to advance to the next phoneme, the text decides WHAT comes next: all probability
the model puts on any marker token (or on <end>) is moved onto the expected next marker (<end> once every
phoneme has been spoken). The first generated token is always the first phoneme's marker, and special
tokens that never occur in generated speech are masked. A pure function of (history, logits), so the
engine can apply it identically to draft and target logits.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.speech.base import DecodeConstraint
from engine.speech.demo_layout import END, DemoVocab


class MarkerMergeConstraint(DecodeConstraint):
    def __init__(self, vocab: DemoVocab, expected_markers: Sequence[int]):
        if not expected_markers:
            raise ValueError("the text has no phonemes")
        self.expected = list(expected_markers) + [END]  # expected[k] follows k spoken markers
        self.marker_lo, self.marker_hi = vocab.marker_ids.start, vocab.marker_ids.stop
        merge = torch.zeros(vocab.vocab_size, dtype=torch.bool)
        merge[self.marker_lo:self.marker_hi] = True
        merge[END] = True
        allowed = torch.zeros(vocab.vocab_size, dtype=torch.bool)
        allowed[vocab.code_offset:] = True
        self._merge = merge  # [V] tokens whose mass moves to the expected marker
        self._blocked = ~(allowed | merge)  # [V] specials that never occur in generated speech

    def next_marker(self, history: Sequence[int]) -> int:
        spoken = sum(1 for t in history if self.marker_lo <= t < self.marker_hi)
        return self.expected[min(spoken, len(self.expected) - 1)]

    def apply(self, logits: torch.Tensor, histories: Sequence[Sequence[int]]) -> torch.Tensor:
        # logits: [n, V]
        n = logits.shape[0]
        merge, blocked = self._merge.to(logits.device), self._blocked.to(logits.device)
        neg_inf = torch.finfo(logits.dtype).min
        target = torch.tensor([self.next_marker(h) for h in histories], device=logits.device)  # [n]
        merged = torch.logsumexp(logits.masked_fill(~merge, float("-inf")), dim=-1)  # [n]
        out = logits.masked_fill(merge | blocked, neg_inf)
        out[torch.arange(n, device=logits.device), target] = merged.to(out.dtype)
        first = torch.tensor([len(h) == 0 for h in histories], device=logits.device)  # [n]
        if first.any():  # speech always opens with the first phoneme's marker
            out[first] = neg_inf
            out[first, self.expected[0]] = 0.0
        return out
