"""Pitch-preserving speed change for the `speed` parameter, streamed through ffmpeg's `atempo` filter.

One `atempo` stage handles factors in [0.5, 100]; slower speeds chain several 0.5 stages, so 0.25 is
0.5 x 0.5. The filter keeps state across chunks, so chunked output equals one-shot output up to its own
look-ahead, which `finish()` flushes.
"""

from __future__ import annotations

import av
import numpy as np
from av.filter import Graph


def _atempo_factors(speed: float) -> list[float]:
    factors = []
    while speed < 0.5:
        factors.append(0.5)
        speed /= 0.5
    factors.append(speed)
    return factors


class TempoStream:
    def __init__(self, sample_rate: int, speed: float):
        self.sample_rate = sample_rate
        self._graph = Graph()
        node = self._graph.add_abuffer(sample_rate=sample_rate, format="flt", layout="mono", channels=1)
        for factor in _atempo_factors(speed):
            stage = self._graph.add("atempo", f"tempo={factor:.6f}")
            node.link_to(stage)
            node = stage
        sink = self._graph.add("abuffersink")
        node.link_to(sink)
        self._graph.configure()
        self._pts = 0

    def _drain(self) -> np.ndarray:
        out = []
        while True:
            try:
                frame = self._graph.pull()
            except (av.BlockingIOError, av.EOFError):
                break
            out.append(frame.to_ndarray().reshape(-1).astype(np.float32))
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def process(self, audio: np.ndarray) -> np.ndarray:
        """float32 [n] -> float32 [~n / speed] (whatever the filter has ready)."""
        if audio.size == 0:
            return np.zeros(0, np.float32)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(audio, np.float32)[None, :], format="flt",
                                           layout="mono")
        frame.sample_rate = self.sample_rate
        frame.pts = self._pts
        self._pts += audio.size
        self._graph.push(frame)
        return self._drain()

    def finish(self) -> np.ndarray:
        self._graph.push(None)
        return self._drain()
