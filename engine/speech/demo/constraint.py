"""The marker-merge decode constraint of the demo phoneme family, with per-phoneme duration caps.

The model decides WHEN to advance to the next phoneme, the text decides WHAT comes next: all probability
the model puts on any marker token (or on <end>) is moved onto the expected next marker (<end> once every
phoneme has been spoken). The first generated token is always the first phoneme's marker, and special
tokens that never occur in generated speech are masked.

Duration caps: a phoneme that has already taken its cap of frames (the bundle's `max_phoneme_frames`, a high
percentile of that phoneme's durations in the training corpus) is ended, i.e. the next marker is forced.
Without them the model, fed its own samples, sometimes stays in a phoneme far longer than any training
utterance does and drifts into loops (models/demo-en/README.md measures both). It also bounds every
utterance's length by the text. Duration windows: with a duration model (engine/speech/demo/durations.py)
the family gives every phoneme of the text both a minimum and a maximum, so it ends inside a window
around its predicted duration.

A pure function of (history, logits), so the engine applies it identically to draft and target logits and
speculative decoding stays exact with respect to the constrained target.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from pcgtts.engine.ops import Ops
from pcgtts.engine.ops.marker_merge import MARKER_MERGE
from pcgtts.engine.speech.base import DecodeConstraint, DraftedHistories
from pcgtts.engine.speech.demo.layout import END, DemoVocab


class MarkerMergeConstraint(DecodeConstraint):
    def __init__(self, vocab: DemoVocab, expected_markers: Sequence[int],
                 max_frames: Sequence[int | None] | None = None, min_frames: Sequence[int] | None = None):
        """max_frames[k]: most frames the k-th expected phoneme may take (None or absent: no cap);
        min_frames[k]: fewest frames it must take before it may end (absent: 0)."""
        if not expected_markers:
            raise ValueError("the text has no phonemes")
        for name, bound in (("max_frames", max_frames), ("min_frames", min_frames)):
            if bound is not None and len(bound) != len(expected_markers):
                raise ValueError(f"{name} needs one entry per expected marker")
        self.expected = list(expected_markers) + [END]  # expected[k] follows k spoken markers
        self.max_frames = list(max_frames) if max_frames is not None else [None] * len(expected_markers)
        self.min_frames = list(min_frames) if min_frames is not None else [0] * len(expected_markers)
        self.marker_lo, self.marker_hi = vocab.marker_ids.start, vocab.marker_ids.stop
        self.code_lo = vocab.code_offset
        merge = torch.zeros(vocab.vocab_size, dtype=torch.bool)
        merge[self.marker_lo:self.marker_hi] = True
        merge[END] = True
        allowed = torch.zeros(vocab.vocab_size, dtype=torch.bool)
        allowed[vocab.code_offset:] = True
        self._vocab_key = (vocab.vocab_size, self.marker_lo, self.marker_hi, self.code_lo)  # fixes both masks
        self._merge = merge  # [V] tokens whose mass moves to the expected marker
        self._blocked = ~(allowed | merge)  # [V] specials that never occur in generated speech
        # (history, its position) of recent calls: a new history that extends one of them is scanned only
        # past it, so a step costs O(new tokens), not O(length), per position; checked by prefix equality
        self._memo: list[tuple[list[int], int, int]] = []
        # the engine's calls (DraftedHistories): per token list read, (the list, its start, how far it was
        # read, the position there); the list only grows, so what was read stays valid
        self._read: list[tuple[list[int], int, int, int, int]] = []

    def without_caps(self) -> MarkerMergeConstraint:
        """The same constraint with no duration bounds (to measure what they do)."""
        out = copy.copy(self)
        out.max_frames = [None] * len(self.max_frames)
        out.min_frames = [0] * len(self.min_frames)
        return out

    def position(self, history: Sequence[int]) -> tuple[int, int]:
        """(markers spoken so far, frames since the last of them)."""
        return self._scan(history, 0, 0, 0)

    def _scan(self, history: Sequence[int], start: int, spoken: int, run: int) -> tuple[int, int]:
        for t in history[start:]:
            if self.marker_lo <= t < self.marker_hi:
                spoken, run = spoken + 1, 0
            elif t >= self.code_lo:
                run += 1
        return spoken, run

    def _positions(self, histories: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
        """position() of each history. The engine passes one request's committed output plus 0..k of its
        drafts, so every history extends the shortest, and that one extends an earlier call's (within a
        step, every call has the same shortest history: the last call's)."""
        histories = [h if isinstance(h, list) else list(h) for h in histories]
        base = min(histories, key=len)
        n = len(base)
        known: tuple[list[int], int, int] = ([], 0, 0)
        for memo in reversed(self._memo):  # newest first: the last call's base is the usual match
            size = len(memo[0])
            if len(known[0]) < size <= n and (base == memo[0] if size == n else base[:size] == memo[0]):
                known = memo
                if size == n:
                    break
        spoken, run = self._scan(base, len(known[0]), known[1], known[2])
        if len(known[0]) < n:
            self._memo = [*self._memo[-3:], (list(base), spoken, run)]
        return [(spoken, run) if h is base else self._scan(h, n, spoken, run) if h[:n] == base
                else self.position(h) for h in histories]

    def _drafted_positions(self, histories: DraftedHistories) -> list[tuple[int, int]]:
        """_positions of the engine's histories: the generated tokens read on from where the last call over
        the same token list stopped, then one draft per position; O(new tokens + drafts) a call."""
        tokens, start, n = histories.tokens, histories.start, histories.generated()
        known = next((e for e in self._read if e[0] is tokens and e[1] == start and e[2] <= n), None)
        read, spoken, run = (known[2], known[3], known[4]) if known else (0, 0, 0)
        spoken, run = self._scan(tokens, start + read, spoken, run)
        self._read = [e for e in self._read if e is not known][-3:] + [(tokens, start, n, spoken, run)]
        drafts, offset = histories.drafts, histories.offset
        spoken, run = self._scan(drafts[:offset], 0, spoken, run)
        positions = [(spoken, run)]
        for draft in drafts[offset:offset + histories.count - 1]:
            spoken, run = self._scan((draft,), 0, spoken, run)
            positions.append((spoken, run))
        # positions past the last draft see no more of them (their history is the one before)
        return positions + positions[-1:] * (histories.count - len(positions))

    def next_marker(self, history: Sequence[int]) -> int:
        return self.expected[min(self.position(history)[0], len(self.expected) - 1)]

    def _must_advance(self, spoken: int, run: int) -> bool:
        if not 1 <= spoken <= len(self.max_frames):
            return False
        cap = self.max_frames[spoken - 1]
        return cap is not None and run >= cap

    def _may_advance(self, spoken: int, run: int) -> bool:
        return not 1 <= spoken <= len(self.min_frames) or run >= self.min_frames[spoken - 1]

    def apply(self, logits: torch.Tensor, histories: Sequence[Sequence[int]]) -> torch.Tensor:
        # logits: [n, V]
        return self.apply_rows([self], logits[None], [histories])[0]

    def _plan(self, histories: Sequence[Sequence[int]]) -> tuple[list[int], list[bool], list[bool]]:
        """Per history: (the marker its merged mass goes to, forced: only that marker may follow, held:
        that marker may not follow yet). Speech opens with the first phoneme's marker; a phoneme at its cap
        ends, one short of its minimum goes on (a cap wins over a minimum)."""
        if isinstance(histories, DraftedHistories):
            positions, lengths = self._drafted_positions(histories), histories.lengths()
        else:
            positions, lengths = self._positions(histories), [len(h) for h in histories]
        targets, forced, held = [], [], []
        for length, (spoken, run) in zip(lengths, positions, strict=True):
            targets.append(self.expected[min(spoken, len(self.expected) - 1)])
            must = length == 0 or self._must_advance(spoken, run)
            forced.append(must)
            held.append(not must and not self._may_advance(spoken, run))
        return targets, forced, held

    def _masks(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(merge columns Long[M], merge | blocked Bool[V]) on `device`, made once."""
        if getattr(self, "_masks_on", (None,))[0] != device:
            merge = self._merge.to(device)
            self._masks_on = (device, merge.nonzero().squeeze(1), merge | self._blocked.to(device))
        return self._masks_on[1], self._masks_on[2]

    @classmethod
    def apply_rows(cls, constraints, logits, histories, ops: Ops | None = None):
        """logits [R, P, V] -> [R, P, V]: the marker merge of all R·P positions in one call of the op
        (engine/ops/marker_merge.py) in the form `ops` names (None: the one that applies to the logits)."""
        first = constraints[0]
        if any(c._vocab_key != first._vocab_key for c in constraints):  # other vocabularies: one at a time
            return super().apply_rows(constraints, logits, histories, ops)
        r, p, v = logits.shape
        targets, forced, held = [], [], []
        for c, h in zip(constraints, histories, strict=True):
            t, f, hd = c._plan(h)
            targets += t
            forced += f
            held += hd
        merge_cols, closed = first._masks(logits.device)
        merge = Ops.given_or_for(ops, logits).form(MARKER_MERGE)
        return merge(logits.reshape(r * p, v), merge_cols, closed, targets, forced, held).view(r, p, v)
