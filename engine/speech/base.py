"""The speech-family contract: how a speech-token LM's prompts, tokens and constraints look.

A family knows its prompt format (text + optional voice prompt -> token ids), the mapping between LM
token ids and codec codes, its end tokens, and any decode-time constraint. The engine is family-agnostic:
it receives prompt ids, stop ids and an optional per-request `DecodeConstraint`, which it applies to the
draft's and the target's logits identically before acceptance, so speculative decoding stays exact
with respect to the constrained target.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from pcgtts.engine.ops import Ops


@dataclass
class VoicePrompt:
    """A reference clip as codec codes plus its transcript (the voice to clone)."""

    codes: np.ndarray  # int [frames]
    transcript: str


class DraftedHistories(Sequence[list[int]]):
    """One request's histories at `count` consecutive positions, without copying them: position i follows
    the request's generated tokens, tokens[start:], and its first offset + i drafts. What the engine hands a
    constraint for each row (a history is a list only when indexed). `tokens` is the request's own token
    list, which only grows while the request runs (the engine appends what it accepts), so a constraint may
    remember how far it has read it (MarkerMergeConstraint does) instead of comparing histories."""

    __slots__ = ("tokens", "start", "drafts", "offset", "count")

    def __init__(self, tokens: list[int], start: int, drafts: list[int], offset: int, count: int):
        self.tokens, self.start, self.drafts, self.offset, self.count = tokens, start, drafts, offset, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.count))]
        if not -self.count <= i < self.count:
            raise IndexError(i)
        return self.tokens[self.start:] + self.drafts[:self.offset + i % self.count]

    def generated(self) -> int:
        """Tokens generated before the first draft."""
        return len(self.tokens) - self.start

    def lengths(self) -> list[int]:
        """len() of each position's history."""
        n, drafted = self.generated(), len(self.drafts)
        return [n + min(drafted, self.offset + i) for i in range(self.count)]


class DecodeConstraint(ABC):
    """A per-request, history-dependent transform of next-token logits.

    `apply` receives the logits of several positions of ONE request and, for each, the tokens generated
    before it (prompt excluded). It must be a pure function of (generated history, logits): the engine
    calls it for the draft's proposals and for the target's γ+1 verification positions with the same
    histories, and the result must not depend on which model produced the logits.
    """

    # Set when the constraint is a fixed set of allowed tokens, whatever came before: an engine that cannot
    # run `apply` position by position (vLLM) applies it as a mask instead. None: history-dependent.
    allowed_token_ids: list[int] | None = None

    @abstractmethod
    def apply(self, logits: torch.Tensor, histories: Sequence[Sequence[int]]) -> torch.Tensor:
        """logits: [n, V] float; histories: n generated-token lists (from the engine a DraftedHistories,
        whose items are those lists) -> constrained logits [n, V]."""

    @classmethod
    def apply_rows(cls, constraints: Sequence[DecodeConstraint], logits: torch.Tensor,
                   histories: Sequence[Sequence[Sequence[int]]], ops: Ops | None = None) -> torch.Tensor:
        """Several requests at once: logits [R, P, V], row r constrained by constraints[r] (all of class
        `cls`) with histories[r] (P lists) -> [R, P, V]. Families override it to constrain the whole batch
        in a few tensor ops (a decoding step pays per op, not per element); the result must equal each
        row's `apply`. ops: the engine's choice of forms for an operation in engine/ops (None: the one
        that applies to the logits)."""
        return torch.stack([c.apply(rows, h) for c, rows, h in zip(constraints, logits, histories,
                                                                    strict=True)])


@dataclass(frozen=True)
class WordSpan:
    """Where one word of a segment's text lies in its generated speech, in codec frames from the segment's
    first frame."""

    text: str  # the word as written, without the punctuation around it
    start_frame: int
    end_frame: int  # exclusive


class WordAligner(ABC):
    """Reads one segment's generated tokens back into word timings, as they arrive. Made by the family with
    the segment's prompt (`SpeechPrompt.word_aligner`), from what the family knows of its own alignment;
    families that do not know it make none, and nothing is guessed."""

    @abstractmethod
    def push(self, token_ids: Sequence[int]) -> list[WordSpan]:
        """Tokens generated since the last call -> the words whose span they completed, in order."""

    @abstractmethod
    def finish(self) -> list[WordSpan]:
        """The segment's speech ended: the words still open."""


@dataclass
class SpeechPrompt:
    token_ids: list[int]
    stop_token_ids: list[int]
    constraint: DecodeConstraint | None = None
    word_aligner: WordAligner | None = None  # None: the family cannot say where the words lie


class SpeechFamily(ABC):
    """Everything the TTS service asks of a family; implementations: `demo/` and `llasa.py`."""

    name: str
    # True: `from_dir` gets the target checkpoint's directory (the family reads that checkpoint's own
    # tokenizer, as Llasa does); False: the bundle's root.
    tokenizer_in_target: bool = False
    # True: its prompts carry a WordAligner (the family knows where each word of the text is spoken)
    aligns_words: bool = False
    # Tokens every utterance generates before its first codec code (the demo family's first phoneme
    # marker): a max_tokens of this many or fewer makes no audio at all.
    tokens_before_audio: int = 0

    @classmethod
    @abstractmethod
    def from_dir(cls, root: str | Path) -> SpeechFamily:
        """The family of the model bundle (or checkpoint) at `root`."""

    @abstractmethod
    def build_prompt(self, text: str, voice: VoicePrompt | None) -> SpeechPrompt:
        """Text (+ the voice to clone; None = the family's default) -> prompt; ValueError when nothing in
        `text` is speakable."""

    @abstractmethod
    def tokens_to_codes(self, token_ids: Sequence[int]) -> np.ndarray:
        """Generated LM tokens -> codec codes, dropping non-speech tokens (markers, end tokens)."""

    @abstractmethod
    def codes_to_tokens(self, codes: np.ndarray) -> list[int]:
        ...

    def preset_voices(self) -> dict[str, VoicePrompt]:
        """The family's own preset voices, its default first; {} when it has none (the service then reads
        reference clips from the bundle's voices directory)."""
        return {}

    def speech_token_ids(self) -> list[int] | None:
        """The tokens this family's model generates (speech tokens and end tokens), for engines that mask
        the rest (vLLM's allowed_token_ids); None: no fixed set."""
        return None

    def split_sentence(self, sentence: str) -> list[str] | None:
        """One sentence (the service finds them, `tts/text.py`) -> the pieces to synthesise one after
        another, e.g. clauses of the length the model was trained on; None: the service cuts only
        sentences longer than its `sentence_max_chars`."""
        return None
