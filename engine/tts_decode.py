"""The codec threads of the TTS service: streaming decode off the event loop."""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
import weakref

import numpy as np

from engine.codec.base import StreamingDecoder


class DecodePool:
    """Threads that run the codec for every live stream, so the event loop never runs model code.

    Each stream keeps its own `StreamingDecoder` (codecs such as the demo's block Griffin-Lim carry
    per-utterance state), so a decoder is pinned to one thread; decoders are spread over the threads
    round-robin. One thread suits a 2-core CPU (the engine has its own).

    Jobs run earliest deadline first: a stream's deadline is when its listener would run out of audio,
    and streams with no audio yet come before all others, so first chunks overtake streams that have
    audio buffered (time to first audio under concurrency). A stream has at most one job pending (it
    awaits each), so its own jobs still run in order.
    """

    def __init__(self, threads: int = 1):
        self._queues: list[queue.PriorityQueue] = [queue.PriorityQueue() for _ in range(max(1, threads))]
        self._order = itertools.count()  # ties (equal deadlines) go first come, first served
        self._threads = [threading.Thread(target=self._run, args=(q,), name=f"pcgtts-codec-{i}", daemon=True)
                         for i, q in enumerate(self._queues)]
        self._next = itertools.cycle(range(len(self._queues)))
        self._pinned: weakref.WeakKeyDictionary[StreamingDecoder, int] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        for thread in self._threads:
            thread.start()

    async def push(self, decoder: StreamingDecoder, codes: np.ndarray | None,
                   deadline: float = 0.0) -> tuple[np.ndarray, float]:
        """Feeds codes to the stream's decoder (None = flush) -> (final audio so far, seconds taken).
        deadline: time.perf_counter() value by which the stream needs more audio."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            slot = self._pinned.setdefault(decoder, next(self._next))
        self._queues[slot].put((deadline, next(self._order), (decoder, codes, loop, future)))
        return await future

    @staticmethod
    def _run(jobs: queue.PriorityQueue) -> None:
        while (job := jobs.get()[2]) is not None:
            decoder, codes, loop, future = job
            start = time.perf_counter()
            try:
                audio = decoder.flush() if codes is None else decoder.push(codes)
                result, error = (np.asarray(audio, dtype=np.float32), time.perf_counter() - start), None
            except Exception as exc:  # handed to the waiting stream
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(_resolve, future, result, error)
            except RuntimeError:  # the stream's event loop is gone
                pass

    def close(self) -> None:
        for jobs in self._queues:
            jobs.put((float("inf"), next(self._order), None))
        for thread in self._threads:
            thread.join(timeout=5)


def _resolve(future: asyncio.Future, result, error) -> None:
    if future.done():  # the waiting stream was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
