"""The codec in a process of its own, so that it and the engine each hold a core.

The engine thread and the codec threads of one process share Python's interpreter lock: every small torch
op, every line of Python between them, waits for it. On a 2-core CPU the two then run in turns part of the
time. Measured on the AMD EPYC build machine (`bench/results/codec-process/`): a batch-16 PCG decode and a
16-stream codec decode side by side as two threads of one process took 1.21x and 1.42x their time alone,
as two processes 0.95x and 0.98x.

`CodecProcess` runs one codec in a child interpreter started afresh (`serve_socket`, through `python -c`:
forking a process that has started torch's and the engine's threads is unsafe, and multiprocessing's spawn
would re-run the parent's main script, which a user's script may not guard). The child loads the codec from
its `CodecRecipe` (the bundle on disk, as the service loaded it) and keeps each stream's `StreamingDecoder`;
the parent holds `RemoteDecoder` handles. A batch is one message each way: the streams' new codes out, their
audio (and what each decoder still needs before its next audio) back. Decoders whose handles are gone are
dropped with the next message.
"""

from __future__ import annotations

import itertools
import logging
import pickle
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
from pcgtts.engine.codec.base import Codec, StreamingDecoder
from pcgtts.engine.faults import is_device_fault

log = logging.getLogger("pcgtts.codec")

# (audio float32 [samples], codec seconds charged to the stream) or None, and the stream's error or None
Result = tuple[tuple[np.ndarray, float] | None, BaseException | None]
START_TIMEOUT_S = 120.0  # a child that has not loaded its codec by then is taken for dead


def decode_isolated(codec: Codec, work: list[tuple[StreamingDecoder, np.ndarray | None]]) -> list[Result]:
    """One batched `decode_streams` call for every stream (codes None: flush) -> each stream's result.

    One stream's failure is its own: before a batched call each decoder's state is saved
    (`StreamingDecoder.checkpoint`); when the call raises, every stream is restored and decoded alone, so
    only the streams whose own decode fails get the exception. A fault that is nobody's (device memory)
    fails them all. The batch's time is split evenly among its streams."""
    start = time.perf_counter()
    saved = [decoder.checkpoint() for decoder, _ in work] if len(work) > 1 else None
    try:
        audio = codec.decode_streams(work)
    except Exception as exc:
        if saved is None or is_device_fault(exc):
            return [(None, exc)] * len(work)
        return _one_by_one(codec, work, saved)
    share = (time.perf_counter() - start) / len(work)
    return [((np.asarray(a, dtype=np.float32), share), None) for a in audio]


def _one_by_one(codec: Codec, work: list[tuple[StreamingDecoder, np.ndarray | None]],
                saved: list[Callable[[], None]]) -> list[Result]:
    results: list[Result] = []
    for (decoder, codes), restore in zip(work, saved, strict=True):
        restore()
        start = time.perf_counter()
        try:
            audio = codec.decode_streams([(decoder, codes)])[0]
            results.append(((np.asarray(audio, dtype=np.float32), time.perf_counter() - start), None))
        except Exception as exc:  # this stream's own failure
            results.append((None, exc))
    return results


@dataclass(frozen=True)
class CodecRecipe:
    """How the child loads the codec the service loaded: the bundle's codec from disk, on the CPU."""

    model_dir: Path
    codec_dir: Path | None = None
    first_block_frames: int | None = None  # TTSConfig.initial_codec_chunk_frames
    torch_threads: int = 1

    def load(self) -> Codec:
        import torch
        from pcgtts.tts.bundle import ModelBundle

        torch.set_num_threads(self.torch_threads)
        bundle = ModelBundle.from_dir(self.model_dir, codec_dir=self.codec_dir)
        codec = bundle.load_codec(device="cpu")  # decoding only: no semantic model (X-codec2's encoder)
        if self.first_block_frames is not None:
            codec.set_first_block_frames(self.first_block_frames)
        return codec


class RemoteDecoder:
    """The parent's handle on one stream's decoder in a `CodecProcess`."""

    def __init__(self, stream_id: int, generation: int, slot: int):
        self.stream_id, self.generation, self.slot = stream_id, generation, slot
        self.until: int | None = None  # the child decoder's codes_until_audio after the last decode

    def codes_until_audio(self) -> int | None:
        return self.until


class CodecProcessError(RuntimeError):
    """The codec process exited or could not load its codec."""


class CodecProcess:
    """One child process that decodes for the streams whose handles it made. `decode` is called from one
    thread at a time (the decode pool's thread that owns it); `new_decoder` and handle clean-up from any."""

    def __init__(self, recipe: CodecRecipe, slot: int = 0):
        self.recipe, self.slot = recipe, slot
        self._ids = itertools.count()
        self._closed: list[int] = []  # streams whose handles are gone, dropped with the next message
        self._lock = threading.Lock()
        self.generation = 0
        self.restarts = 0  # children that died and were replaced
        self.child_streams = 0  # decoders the child held after the last batch (handles gone are dropped)
        self._start()

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        with theirs:
            self._process = subprocess.Popen([sys.executable, "-c", _CHILD, str(theirs.fileno())],
                                             pass_fds=[theirs.fileno()])
        self._conn = Connection(ours.detach())
        self._conn.send(self.recipe)
        self._ready = False

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        """Blocks until the child has loaded its codec; raises CodecProcessError if it failed or died."""
        if self._ready:
            return
        if not self._conn.poll(timeout):
            raise CodecProcessError(f"the codec process did not load its codec within {timeout:.0f} s")
        try:
            kind, detail = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise CodecProcessError(f"the codec process exited while loading (code "
                                    f"{self._process.poll()})") from exc
        if kind != "ready":
            raise CodecProcessError(f"the codec process could not load its codec: {detail}")
        self._ready = True

    def new_decoder(self) -> RemoteDecoder:
        with self._lock:
            handle = RemoteDecoder(next(self._ids), self.generation, self.slot)
        weakref.finalize(handle, self._forget, handle.stream_id, handle.generation)
        return handle

    def _forget(self, stream_id: int, generation: int) -> None:
        with self._lock:
            if generation == self.generation:
                self._closed.append(stream_id)

    def decode(self, work: list[tuple[RemoteDecoder, np.ndarray | None]]) -> list[Result]:
        """The streams' codes decoded in the child, one batched call -> each stream's result; a stream
        whose decoder was lost with an earlier child gets an error, and a child that dies fails the batch
        (the next batch starts a new one)."""
        results: list[Result | None] = [None] * len(work)
        live = []
        for i, (handle, _) in enumerate(work):
            if handle.generation != self.generation:
                results[i] = (None, CodecProcessError("this stream's codec state was lost when the codec "
                                                      "process restarted"))
            else:
                live.append(i)
        if live:
            with self._lock:
                closed, self._closed = self._closed, []
            try:
                self.wait_ready()
                self._conn.send((closed, [(work[i][0].stream_id, work[i][1]) for i in live]))
                replies, self.child_streams = self._conn.recv()
            except (EOFError, OSError, CodecProcessError) as exc:
                code = self._restart()
                for i in live:
                    results[i] = (None, CodecProcessError(f"the codec process exited (code {code}): "
                                                          f"{exc or type(exc).__name__}"))
                return results
            for i, (result, error, until) in zip(live, replies, strict=True):
                work[i][0].until = until
                results[i] = (result, error)
        return results

    def _restart(self) -> int | None:
        """A new child for the streams to come -> the old one's exit code."""
        with self._lock:
            self.generation += 1
            self._closed = []
        code = self._stop_child(timeout=1.0)
        self.restarts += 1
        log.warning("codec process %d exited (code %s): its streams fail, a new one takes the next",
                    self.slot, code)
        self._start()
        return code

    def close(self) -> None:
        self._stop_child(timeout=5.0)

    def _stop_child(self, timeout: float) -> int | None:
        try:
            self._conn.send(None)
        except (OSError, ValueError):
            pass
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout)
        self._conn.close()
        return self._process.returncode


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.dumps(exc)
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _serve(conn: Connection) -> None:
    """The child: load the codec its recipe names, then answer batches until told to stop (None) or the
    parent goes."""
    try:
        codec = conn.recv().load()
    except Exception as exc:  # the parent raises it at start-up
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    decoders: dict[int, StreamingDecoder] = {}
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if message is None:
            return
        closed, work = message
        for stream_id in closed:
            decoders.pop(stream_id, None)
        for stream_id, _ in work:  # a stream's first batch makes its decoder
            if stream_id not in decoders:
                decoders[stream_id] = codec.streaming_decoder()
        streams = [(decoders[i], codes) for i, codes in work]
        replies = [(result, None if error is None else _picklable(error), decoder.codes_until_audio())
                   for (result, error), (decoder, _) in zip(decode_isolated(codec, streams), streams,
                                                            strict=True)]
        conn.send((replies, len(decoders)))


def serve_socket(fd: int) -> None:
    """The child's entry: its end of the socket pair, as a Connection."""
    from pcgtts.engine.torch_threads import name_native_thread

    name_native_thread("pcgtts-codec-p")  # the child's main thread: `ps` shows the process so
    _serve(Connection(fd))


_CHILD = "import sys; from pcgtts.tts.codec_process import serve_socket; serve_socket(int(sys.argv[1]))"
