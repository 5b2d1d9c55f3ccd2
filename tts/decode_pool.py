"""The codec threads of the TTS service: streaming decode off the event loop, batched across streams."""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
import weakref
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
from pcgtts.engine.codec.base import Codec, StreamingDecoder
from pcgtts.engine.torch_threads import adopt_torch_threads, name_native_thread
from pcgtts.tts.codec_process import CodecProcess, CodecRecipe, RemoteDecoder, decode_isolated


@dataclass
class CodecStats:
    """Totals since start: codec calls, the stream jobs they served (calls < jobs when batched), seconds."""

    calls: int = 0
    stream_jobs: int = 0
    seconds: float = 0.0
    process_restarts: int = 0  # codec processes that died and were replaced (tts/codec_process.py)

    def record(self, jobs: int, seconds: float) -> None:
        self.calls += 1
        self.stream_jobs += jobs
        self.seconds += seconds


class DecodePool:
    """Threads that run the codec for every live stream, so the event loop never runs model code.

    Each thread takes every job waiting in its queue (up to `max_batch`) and runs them as one
    `Codec.decode_streams` call, so concurrent streams share batched codec passes. Each stream keeps its
    own `StreamingDecoder` (codecs such as the demo's block Griffin-Lim carry per-utterance state), so a
    decoder is pinned to one thread; decoders are spread over the threads round-robin. One thread suits a
    2-core CPU (the engine has its own).

    With a `CodecRecipe` each thread hands its batches to a codec process of its own (tts/codec_process.py:
    the codec then does not wait for the interpreter lock the engine thread holds), and its streams'
    decoders live there; `streaming_decoder` gives the handles.

    Jobs are taken earliest deadline first: a stream's deadline is when its listener would run out of
    audio, and streams with no audio yet come before all others, so first chunks overtake streams that
    have audio buffered (time to first audio under concurrency). A stream has at most one job pending (it
    awaits each), so its own jobs still run in order and a batch holds each stream at most once.

    One stream's failure is its own (`decode_isolated`): only the streams whose own decode fails get the
    exception (e.g. codes a codec cannot take), and the others get their audio as if nothing happened.
    """

    def __init__(self, codec: Codec, threads: int = 1, max_batch: int = 16,
                 process: CodecRecipe | None = None):
        self.codec = codec
        self.max_batch = max(1, max_batch)
        count = max(1, threads)
        self._queues: list[queue.PriorityQueue] = [queue.PriorityQueue() for _ in range(count)]
        self._workers = [CodecProcess(process, slot) for slot in range(count)] if process else []
        self._order = itertools.count()  # ties (equal deadlines) go first come, first served
        self._threads = [threading.Thread(target=self._run, args=(slot,), name=f"pcgtts-codec-{slot}",
                                          daemon=True) for slot in range(count)]
        self._next = itertools.cycle(range(count))
        self._pinned: weakref.WeakKeyDictionary[StreamingDecoder, int] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self.stats = CodecStats()  # running totals, read by the metrics endpoint
        for thread in self._threads:
            thread.start()

    @property
    def in_process(self) -> bool:
        """Whether the codec runs in a process of its own (else on these threads)."""
        return bool(self._workers)

    def wait_ready(self) -> None:
        """Blocks until every codec process has loaded its codec (raises CodecProcessError if one failed)."""
        for worker in self._workers:
            worker.wait_ready()

    def streaming_decoder(self) -> StreamingDecoder | RemoteDecoder:
        """A new stream's decoder: the codec's own, or a handle on one in a codec process."""
        if not self._workers:
            return self.codec.streaming_decoder()
        with self._lock:
            slot = next(self._next)
        return self._workers[slot].new_decoder()

    async def push(self, decoder: StreamingDecoder | RemoteDecoder, codes: np.ndarray | None,
                   deadline: float = 0.0) -> tuple[np.ndarray, float]:
        """Feeds codes to the stream's decoder (None = flush) -> (final audio so far, seconds of codec time
        charged to it: its batch's time split evenly). deadline: time.perf_counter() value by which the
        stream needs more audio."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if isinstance(decoder, RemoteDecoder):
            slot = decoder.slot
        else:
            with self._lock:
                slot = self._pinned.setdefault(decoder, next(self._next))
        self._queues[slot].put((deadline, next(self._order), (decoder, codes, loop, future)))
        return await future

    def _take(self, jobs: queue.PriorityQueue) -> tuple[list[tuple], bool]:
        """Blocks for one job, then takes those already waiting -> (batch, whether to stop after it)."""
        batch, stop = [], False
        job = jobs.get()[2]
        while job is not None:
            batch.append(job)
            if len(batch) == self.max_batch:
                break
            try:
                job = jobs.get_nowait()[2]
            except queue.Empty:
                break
        else:
            stop = True
        return batch, stop

    def _run(self, slot: int) -> None:
        adopt_torch_threads()
        name_native_thread()
        jobs = self._queues[slot]
        decode = self._workers[slot].decode if self._workers else partial(decode_isolated, self.codec)
        stop = False
        while not stop:
            batch, stop = self._take(jobs)
            if not batch:
                continue
            start = time.perf_counter()
            results = decode([(decoder, codes) for decoder, codes, _, _ in batch])
            self.stats.record(len(batch), time.perf_counter() - start)
            for (_, _, loop, future), (result, error) in zip(batch, results, strict=True):
                try:
                    loop.call_soon_threadsafe(_resolve, future, result, error)
                except RuntimeError:  # the stream's event loop is gone
                    pass

    def snapshot(self) -> CodecStats:
        return replace(self.stats, process_restarts=sum(worker.restarts for worker in self._workers))

    def close(self) -> None:
        for jobs in self._queues:
            jobs.put((float("inf"), next(self._order), None))
        for thread in self._threads:
            thread.join(timeout=5)
        for worker in self._workers:
            worker.close()


def _resolve(future: asyncio.Future, result, error) -> None:
    if future.done():  # the waiting stream was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
