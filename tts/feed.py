"""The text of one utterance while it is still arriving (a voice agent's LLM writing its answer).

`TTSService.text_feed()` makes one; text goes in with `push` as it arrives, and a `Synthesis` given the
feed speaks each complete sentence as soon as it is complete, in order, as one utterance: the sentences
are cut by the same rule as a whole input (`tts/text.py`), so where the cuts agree the audio is the one
speaking the whole text at once gives with the same seed. Two bounds keep a long clause from waiting for
its full stop: `max_pending_chars` (checked on every push) and `max_pending_s` (from the oldest character
still pending); either speaks the pending complete words, up to the last comma or dash among them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable

from pcgtts.tts.text import SentenceStream


class TextFeed:
    """Segments of one utterance as its text arrives; iterate once (the synthesis does), on one event loop.

    split: one sentence -> its segments (`TTSService.sentence_segments`)."""

    def __init__(self, split: Callable[[str], list[str]], max_pending_chars: int | None = None,
                 max_pending_s: float | None = None):
        self._split = split
        self._sentences = SentenceStream()
        self._ready: deque[str] = deque()
        self._wake = asyncio.Event()
        self._closed = False
        self.max_pending_chars = max_pending_chars
        self.max_pending_s = max_pending_s
        self._timer: asyncio.TimerHandle | None = None
        self.segments_made = 0  # segments handed out or ready so far
        self.received_chars = 0
        self.starved = False  # the synthesis has taken every segment and waits for more text

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pending(self) -> str:
        """Text received that is not a segment yet (a sentence still being written)."""
        return self._sentences.pending

    def push(self, text: str) -> int:
        """Adds arriving text; returns how many segments it completed."""
        if self._closed:
            raise RuntimeError("the feed is closed")
        self.received_chars += len(text)
        made = self._add(self._sentences.push(text))
        if self.max_pending_chars is not None and len(self.pending.strip()) > self.max_pending_chars:
            made += self.flush_words()
        if made:
            self._cancel_timer()  # what is pending now began after the segments just made
        self._arm_timer()
        return made

    def flush_words(self) -> int:
        """Stops waiting for the pending sentence's end: its complete words become segments now."""
        words = self._sentences.take_words()
        return self._add([words] if words else [])

    def close(self) -> int:
        """No more text comes: the rest becomes segments, and the synthesis ends after them."""
        if self._closed:
            return 0
        made = self._add(self._sentences.finish())
        self._closed = True
        self._cancel_timer()
        self._wake.set()
        return made

    def cancel(self) -> None:
        """Drops every segment not yet handed out and everything pending; the synthesis ends after the
        segment it is speaking (the caller closes it to stop that one too)."""
        self._ready.clear()
        self._sentences = SentenceStream()
        self._closed = True
        self._cancel_timer()
        self._wake.set()

    def _add(self, sentences: list[str]) -> int:
        pieces = [p for sentence in sentences for p in self._split(sentence) if p.strip()]
        self._ready.extend(pieces)
        self.segments_made += len(pieces)
        if pieces:
            self._wake.set()
        return len(pieces)

    def _arm_timer(self) -> None:
        """max_pending_s after the oldest pending character arrived, its complete words are spoken."""
        if self.max_pending_s is None or not self.pending.strip():
            self._cancel_timer()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.max_pending_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if not self._closed:
            self.flush_words()
            self._arm_timer()  # a partial word left waits again

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def started(self) -> bool:
        """Waits until the first segment is ready or the feed is closed; whether there is a segment."""
        while not self.segments_made and not self._closed:
            self._wake.clear()
            await self._wake.wait()
        return self.segments_made > 0

    async def segments(self) -> AsyncIterator[str]:
        """Each segment once it is ready, in order, until the feed is closed and spoken."""
        while True:
            while self._ready:
                yield self._ready.popleft()
            if self._closed:
                return
            self._wake.clear()
            self.starved = True
            try:
                await self._wake.wait()
            finally:
                self.starved = False
