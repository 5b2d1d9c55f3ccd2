"""Word timings of the demo phoneme family, read from the speech it generates.

Each phoneme's marker token comes before that phoneme's frames (`layout.py`), and the marker-merge
constraint makes the markers come in the text's order, so the k-th marker starts the k-th phoneme of the
text. espeak-ng says which word of the text each phoneme speaks (`espeak.phonemize_words`); a word then
takes the frames from its first phoneme's marker to the next marker of another word or of a pause (or the
end of speech). With a duration model these are the durations the constraint forced.
"""

from __future__ import annotations

from collections.abc import Sequence

from pcgtts.engine.speech.base import WordAligner, WordSpan
from pcgtts.engine.speech.demo.layout import END, DemoVocab

_AROUND_WORDS = "\"'“”‘’«»()[]{}.,;:!?…—–-"


class MarkerAligner(WordAligner):
    def __init__(self, vocab: DemoVocab, words: list[str], word_of: Sequence[int | None]):
        """words: the segment's words as written; word_of[k]: the word the k-th phoneme of the prompt
        speaks (None for a pause)."""
        self._marker_lo, self._marker_hi = vocab.marker_ids.start, vocab.marker_ids.stop
        self._code_lo = vocab.code_offset
        self._words = [w.strip(_AROUND_WORDS) or w for w in words]
        self._word_of = list(word_of)
        self._markers = 0  # markers generated so far
        self._frames = 0  # codec frames generated so far
        self._open: tuple[int, int] | None = None  # (word index, start frame) of the word being spoken

    def push(self, token_ids: Sequence[int]) -> list[WordSpan]:
        done: list[WordSpan] = []
        for t in token_ids:
            if self._marker_lo <= t < self._marker_hi:
                k = self._markers
                self._markers += 1
                word = self._word_of[k] if k < len(self._word_of) else None
                if self._open is not None and self._open[0] != word:
                    done += self._close()
                if word is not None and self._open is None:
                    self._open = (word, self._frames)
            elif t >= self._code_lo:
                self._frames += 1
            elif t == END:
                done += self._close()
        return done

    def finish(self) -> list[WordSpan]:
        return self._close()

    def _close(self) -> list[WordSpan]:
        if self._open is None:
            return []
        word, start = self._open
        self._open = None
        return [WordSpan(self._words[word], start, self._frames)]
