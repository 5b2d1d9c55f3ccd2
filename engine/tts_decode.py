"""The codec thread of the TTS service: streaming decode off the event loop."""

from __future__ import annotations

import asyncio
import queue
import threading
import time

import numpy as np

from engine.codec.base import StreamingDecoder


class DecodeWorker:
    """One thread that runs the codec for every live stream, so the event loop never runs model code.

    Each stream keeps its own `StreamingDecoder` (codecs such as the demo's block Griffin-Lim carry
    per-utterance state); jobs of all streams run in arrival order, alongside the engine's own thread.
    """

    def __init__(self):
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="pcgtts-codec", daemon=True)
        self._thread.start()
        self.jobs_done = 0

    async def push(self, decoder: StreamingDecoder, codes: np.ndarray | None) -> tuple[np.ndarray, float]:
        """Feeds codes to the stream's decoder (None = flush) -> (final audio so far, seconds taken)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.put((decoder, codes, loop, future))
        return await future

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            decoder, codes, loop, future = job
            start = time.perf_counter()
            try:
                audio = decoder.flush() if codes is None else decoder.push(codes)
                result, error = (np.asarray(audio, dtype=np.float32), time.perf_counter() - start), None
            except Exception as exc:  # handed to the waiting stream
                result, error = None, exc
            self.jobs_done += 1
            try:
                loop.call_soon_threadsafe(_resolve, future, result, error)
            except RuntimeError:  # the stream's event loop is gone
                pass

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=5)


def _resolve(future: asyncio.Future, result, error) -> None:
    if future.done():  # the waiting stream was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
