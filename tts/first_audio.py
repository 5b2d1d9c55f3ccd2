"""Pacing a stream's first audio: held back until the stream can keep its listener fed.

A listener starts playing at the first chunk. When the chunk after it needs more codes than the first
chunk lasts at the stream's code rate, the listener runs dry right after the start. The demo codec's
first block reads none of its conv decoder's look-ahead (the earliest first audio), so its second block
needs 24 more codes for the first block's 16 frames: generation at 1.5x real time. Under load (16 streams
at about 1.2x real time each on a 2-core CPU) nearly every stream stalled there, and only there
(`bench load --timelines`, bench/results/first-audio/). Holding the first audio until the next chunk is
predicted to arrive before it runs out moves that wait before the first sound, and costs nothing when the
stream runs fast (one stream runs several times real time: released at once). The audio is unchanged;
only when it leaves moves.
"""

from __future__ import annotations

import numpy as np


class FirstAudioPacer:
    """Holds a stream's first audio until `codes needed for the next audio / code rate + decode latency`
    fits inside the audio held, or `max_hold_s` after the first audio was ready, whichever comes first."""

    def __init__(self, max_hold_s: float, sample_rate: int):
        self.max_hold_s = max_hold_s
        self.sample_rate = sample_rate
        self._first_codes_at: float | None = None  # perf_counter time of the stream's first codes
        self._later_codes = 0  # codes that arrived after those: the rate is measured over them
        self._held: list[np.ndarray] = []
        self._held_samples = 0
        self._held_since: float | None = None  # when the first audio was ready
        self.held_s = 0.0  # how long the first audio waited (once released)

    def codes_arrived(self, count: int, now: float) -> None:
        if self._first_codes_at is None:
            self._first_codes_at = now
        else:
            self._later_codes += count

    def code_rate(self, now: float) -> float | None:
        """Codes per second since the stream's first codes (None before a second batch of codes)."""
        if self._first_codes_at is None or not self._later_codes or now <= self._first_codes_at:
            return None
        return self._later_codes / (now - self._first_codes_at)

    def hold(self, audio: np.ndarray, now: float) -> None:
        if audio.size:
            self._held.append(audio)
            self._held_samples += audio.size
            if self._held_since is None:
                self._held_since = now

    def release(self, codes_until_audio: int | None, decode_latency_s: float,
                now: float) -> np.ndarray | None:
        """The held audio if it should leave now, else None (nothing held yet, or keep holding).
        codes_until_audio: what the decoder needs before its next audio (None: it cannot say)."""
        if self._held_since is None:
            return None
        rate = self.code_rate(now)
        if (codes_until_audio and rate and now - self._held_since < self.max_hold_s
                and codes_until_audio / rate + decode_latency_s > self._held_samples / self.sample_rate):
            return None
        return self.take(now)

    def take(self, now: float) -> np.ndarray:
        """Everything held, now (the stream ended, or the hold is over)."""
        if self._held_since is not None:
            self.held_s = now - self._held_since
        audio = np.concatenate(self._held) if self._held else np.zeros(0, np.float32)
        self._held, self._held_samples = [], 0
        return audio
