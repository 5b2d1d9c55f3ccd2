"""The TTS service: text + voice in, streamed audio out. The one engine module the server imports.

`TTSService.load(TTSConfig(...))` opens a model bundle (speech family, codec, target/draft models) and
starts an `AsyncEngine`, whose step loop runs in its own thread. `synthesize(text, voice, options)`
returns a `Synthesis`, an async iterator of float32 audio chunks at the codec's rate:

* long text is split into sentences, generated one after another within the same stream;
* speech tokens stream from the engine into a `ChunkedDecoder` that decodes overlapping code windows
  (left context + held-back look-ahead, raised-cosine cross-fade over the overlap) so that joins are
  inaudible, with a small first chunk for a low time to first audio;
* the windows of all live streams go through one `DecodeBatcher` thread, which hands whatever is pending
  to `codec.decode_batch` at once, so concurrent streams share codec forwards and the event loop never
  runs model code;
* closing the iterator (`aclose`) aborts the engine request and frees its KV blocks.

Per-request statistics (time to first audio, tokens, drafted/accepted, audio seconds) are on
`Synthesis.stats`; the engine's counters on `TTSService.engine_stats()`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import queue
import re
import threading
import time
from collections.abc import AsyncIterator
from contextlib import aclosing, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from engine.bundle import DEFAULT_MODEL_DIR, ModelBundle
from engine.codec.base import Codec
from engine.speech.base import SpeechFamily, VoicePrompt

__all__ = ["TTSConfig", "SynthesisOptions", "SynthesisStats", "EngineStats", "Synthesis", "TTSService",
           "VoicePrompt", "InvalidOptions", "ServiceOverloaded", "InputTooLong", "ServiceUnavailable",
           "split_sentences", "ChunkedDecoder"]

log = logging.getLogger("pcgtts.tts")


# ----------------------------------------------------------------------------------------------- errors
class InvalidOptions(ValueError):
    """A synthesis option the served engine cannot honour; `param` names the request field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


class ServiceOverloaded(RuntimeError):
    """The engine's waiting queue is full; retry later."""


class InputTooLong(ValueError):
    """A sentence's prompt does not fit the model length or KV capacity."""


class ServiceUnavailable(RuntimeError):
    """The engine has shut down."""


# ----------------------------------------------------------------------------------------------- config
@dataclass
class TTSConfig:
    """How the service loads its model and streams audio. Every default suits a 2-core CPU."""

    model_dir: str | Path = DEFAULT_MODEL_DIR
    codec_dir: str | Path | None = None  # overrides the bundle's codec
    draft_dir: str | Path | None = None  # overrides the bundle's draft
    device: str = "cpu"
    acceptance: str = "pcg"  # "none" decodes with the target alone
    num_speculative_tokens: int = 3  # γ
    asg_table: str | Path | None = None  # overrides the bundle's ASG table (θ choice)
    kv_budget_tokens: int | None = None
    max_num_seqs: int = 16
    max_waiting: int = 64
    max_tokens: int = 1000  # default cap on generated tokens per sentence
    # Streaming decode, in codec frames: a small first chunk for time to first audio, then larger ones.
    first_chunk_frames: int = 5
    chunk_frames: int = 25
    context_frames: int = 12  # left context decoded with every window
    lookahead_frames: int = 6  # right context held back until more codes arrive
    crossfade_ms: float = 5.0
    max_decode_batch: int = 16
    sentence_max_chars: int = 220
    sentence_pause_s: float = 0.12  # silence between sentences of one input


@dataclass
class SynthesisOptions:
    """Per-request sampling and speculative choices; None = the service default."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    acceptance: str | None = None
    num_speculative_tokens: int | None = None
    asg_table: str | None = None
    streaming: bool = True  # False: decode each sentence in one pass (whole responses)


@dataclass
class SynthesisStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    audio_samples: int = 0
    sample_rate: int = 0
    sentences: int = 0
    started_at: float = field(default_factory=time.perf_counter)
    first_token_s: float | None = None  # since `synthesize` was called
    first_audio_s: float | None = None
    finished_s: float | None = None
    decode_s: float = 0.0  # codec time spent on this request's windows
    finish_reason: str | None = None  # stop | length | abort

    @property
    def audio_seconds(self) -> float:
        return self.audio_samples / self.sample_rate if self.sample_rate else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else None


@dataclass
class EngineStats:
    """A snapshot of the engine's state and counters (the server exports it as Prometheus metrics)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    spec_num_drafts: int = 0
    spec_drafted_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_position: list[int] = field(default_factory=list)
    preemptions: int = 0


# ------------------------------------------------------------------------------------------------- text
_SENTENCE_END = re.compile(r"(?<=[.!?;:…])[\"')\]]*\s+|\n+")
_SOFT_BREAK = re.compile(r"(?<=[,;:–—])\s+")


def _split_long(piece: str, max_chars: int) -> list[str]:
    """A sentence longer than max_chars: break at commas/dashes, else at spaces."""
    out: list[str] = []
    for part in _SOFT_BREAK.split(piece):
        while len(part) > max_chars:
            cut = part.rfind(" ", 0, max_chars)
            cut = cut if cut > 0 else max_chars
            out.append(part[:cut].strip())
            part = part[cut:].strip()
        if part:
            out.append(part)
    merged: list[str] = []
    for part in out:  # re-join tiny fragments with their neighbour
        if merged and len(merged[-1]) + 1 + len(part) <= max_chars:
            merged[-1] = f"{merged[-1]} {part}"
        else:
            merged.append(part)
    return merged


def split_sentences(text: str, max_chars: int = 220) -> list[str]:
    """Text -> speakable segments in order, each at most max_chars long; short sentences are merged."""
    segments: list[str] = []
    for sentence in _SENTENCE_END.split(text.strip()):
        sentence = " ".join(sentence.split())
        if not sentence:
            continue
        for piece in _split_long(sentence, max_chars) if len(sentence) > max_chars else [sentence]:
            if segments and len(segments[-1]) + 1 + len(piece) <= max_chars // 3:
                segments[-1] = f"{segments[-1]} {piece}"  # "Hi. Yes." -> one segment
            else:
                segments.append(piece)
    return segments


# ------------------------------------------------------------------------------------------- decoding
class DecodeBatcher:
    """One thread that decodes code windows for every stream, batching whatever is pending."""

    def __init__(self, codec: Codec, max_batch: int = 16):
        self.codec = codec
        self.max_batch = max_batch
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="pcgtts-codec", daemon=True)
        self._thread.start()
        self.batches = 0  # codec calls made
        self.windows = 0  # windows decoded

    async def decode(self, codes: np.ndarray) -> tuple[np.ndarray, float]:
        """codes: int [n] -> (float32 audio [n * hop], seconds the batch took)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.put((codes, loop, future))
        return await future

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            jobs = [job]
            while len(jobs) < self.max_batch:
                try:
                    more = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._jobs.put(None)
                    break
                jobs.append(more)
            start = time.perf_counter()
            try:
                outputs = self.codec.decode_batch([j[0] for j in jobs])
                error = None
            except Exception as exc:  # handed to every waiting stream
                outputs, error = None, exc
            took = time.perf_counter() - start
            self.batches += 1
            self.windows += len(jobs)
            for i, (_, loop, future) in enumerate(jobs):
                result = (np.asarray(outputs[i], dtype=np.float32), took) if error is None else None
                loop.call_soon_threadsafe(_resolve, future, result, error)

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


class ChunkedDecoder:
    """Streaming decode of one utterance's codes by overlapping windows.

    Each window decodes frames [e - context, upto + lookahead): audio before `e` was sent already, audio
    in [e, upto) is final, and the first `crossfade` samples beyond `upto` are held back and cross-faded
    (raised cosine) with the next window's decode of the same samples, which sees more right context.
    When context and look-ahead cover the codec's receptive field, the output equals a one-pass decode.
    """

    def __init__(self, batcher: DecodeBatcher, hop: int, *, first_chunk_frames: int, chunk_frames: int,
                 context_frames: int, lookahead_frames: int, crossfade: int):
        self._batcher = batcher
        self.hop = hop
        self.first_chunk_frames = first_chunk_frames
        self.chunk_frames = chunk_frames
        self.context = context_frames
        self.lookahead = lookahead_frames
        self.crossfade = min(crossfade, lookahead_frames * hop)
        ramp = np.linspace(0.0, np.pi, self.crossfade, endpoint=False, dtype=np.float64) + np.pi / (2 * max(
            self.crossfade, 1))
        self._fade_in = (0.5 - 0.5 * np.cos(ramp)).astype(np.float32)  # [crossfade], 0 -> 1
        self._codes: list[np.ndarray] = []
        self._num_codes = 0
        self._emitted = 0  # frames whose audio is out (up to the held-back tail)
        self._tail: np.ndarray | None = None  # [crossfade] samples starting at frame `_emitted`
        self.decode_s = 0.0

    def _all_codes(self) -> np.ndarray:
        if len(self._codes) > 1:
            self._codes = [np.concatenate(self._codes)]
        return self._codes[0] if self._codes else np.zeros(0, np.int64)

    def ready(self) -> bool:
        need = self.first_chunk_frames if self._emitted == 0 and self._tail is None else self.chunk_frames
        return self._num_codes - self.lookahead - self._emitted >= need

    def push(self, codes: np.ndarray) -> None:
        if codes.size:
            self._codes.append(np.asarray(codes, dtype=np.int64))
            self._num_codes += codes.size

    async def next_chunk(self, final: bool = False) -> np.ndarray:
        """Audio that is final now (call when `ready()`, or with final=True once all codes are in)."""
        codes = self._all_codes()
        n = codes.size
        upto = n if final else n - self.lookahead
        if upto <= self._emitted:
            return self._flush_tail() if final else np.zeros(0, np.float32)
        start = max(0, self._emitted - self.context)
        end = n if final else min(n, upto + self.lookahead)
        window, took = await self._batcher.decode(codes[start:end])
        self.decode_s += took
        hop = self.hop
        first = (self._emitted - start) * hop
        last = (upto - start) * hop + (0 if final else self.crossfade)
        piece = window[first:last].copy()
        if self._tail is not None and self.crossfade:
            x = min(self.crossfade, piece.size)
            piece[:x] = self._tail[:x] * (1.0 - self._fade_in[:x]) + piece[:x] * self._fade_in[:x]
        self._emitted = upto
        if final:
            self._tail = None
            return piece
        self._tail = piece[piece.size - self.crossfade:] if self.crossfade else None
        return piece[:piece.size - self.crossfade]

    def _flush_tail(self) -> np.ndarray:
        tail, self._tail = self._tail, None
        return tail if tail is not None else np.zeros(0, np.float32)

    @property
    def num_codes(self) -> int:
        return self._num_codes


def _fade_edges(audio: np.ndarray, samples: int, fade_in: bool, fade_out: bool) -> np.ndarray:
    """Short linear fades at sentence joins, so silence inserted between sentences does not click."""
    n = min(samples, audio.size)
    if n == 0:
        return audio
    ramp = np.linspace(0.0, 1.0, n, endpoint=False, dtype=np.float32)
    if fade_in:
        audio[:n] *= ramp
    if fade_out:
        audio[audio.size - n:] *= ramp[::-1]
    return audio


# ------------------------------------------------------------------------------------------- synthesis
class Synthesis:
    """An async iterator of float32 audio chunks for one request; `aclose()` aborts it."""

    def __init__(self, service: TTSService, segments: list[str], voice: VoicePrompt | None,
                 options: SynthesisOptions):
        self._service = service
        self._segments = segments
        self._voice = voice
        self._options = options
        self.stats = SynthesisStats(sample_rate=service.sample_rate)
        self._engine_stream: AsyncIterator | None = None
        self._gen = self._generate()

    def __aiter__(self) -> Synthesis:
        return self

    async def __anext__(self) -> np.ndarray:
        chunk = await self._gen.__anext__()
        st = self.stats
        if st.first_audio_s is None:
            st.first_audio_s = time.perf_counter() - st.started_at
        st.audio_samples += chunk.size
        return chunk

    async def aclose(self) -> None:
        """Stops generation; the engine request is aborted and its KV blocks freed."""
        await self._gen.aclose()
        if self.stats.finish_reason is None:
            self.stats.finish_reason = "abort"

    async def _generate(self) -> AsyncIterator[np.ndarray]:
        svc, cfg = self._service, self._service.config
        pause = np.zeros(int(cfg.sentence_pause_s * svc.sample_rate), np.float32)
        fade = int(0.005 * svc.sample_rate)
        last_index = len(self._segments) - 1
        for index, text in enumerate(self._segments):
            if index > 0 and pause.size:
                yield pause
            pending: np.ndarray | None = None  # one chunk held back to fade the sentence's end
            async with aclosing(self._sentence(index, text)) as chunks:
                async for chunk in chunks:
                    if pending is not None:
                        yield pending
                    elif index > 0:
                        chunk = _fade_edges(chunk, fade, fade_in=True, fade_out=False)
                    pending = chunk
            if pending is not None:
                yield _fade_edges(pending, fade, fade_in=False, fade_out=index < last_index)
            self.stats.sentences += 1
        self.stats.finished_s = time.perf_counter() - self.stats.started_at

    async def _sentence(self, index: int, text: str) -> AsyncIterator[np.ndarray]:
        svc, cfg, opts, st = self._service, self._service.config, self._options, self.stats
        prompt = svc.family.build_prompt(text, self._voice)
        params = svc.sampling_params(opts, prompt, index)
        st.prompt_tokens += len(prompt.token_ids)
        decoder = ChunkedDecoder(
            svc.batcher, svc.hop, first_chunk_frames=cfg.first_chunk_frames, chunk_frames=cfg.chunk_frames,
            context_frames=cfg.context_frames, lookahead_frames=cfg.lookahead_frames,
            crossfade=int(cfg.crossfade_ms * svc.sample_rate / 1000))
        finish_reason = None
        with _engine_errors():
            stream = svc.engine.stream(prompt.token_ids, params)
            try:
                async for delta in stream:
                    if delta.token_ids and st.first_token_s is None:
                        st.first_token_s = time.perf_counter() - st.started_at
                    st.generated_tokens += len(delta.token_ids)
                    st.drafted_tokens += delta.num_drafted
                    st.accepted_tokens += delta.num_accepted
                    decoder.push(svc.family.tokens_to_codes(delta.token_ids))
                    if delta.finished:
                        finish_reason = delta.finish_reason
                        break
                    while opts.streaming and decoder.ready():
                        chunk = await decoder.next_chunk()
                        if chunk.size:
                            yield chunk
                if decoder.num_codes:
                    chunk = await decoder.next_chunk(final=True)
                    if chunk.size:
                        yield chunk
            finally:
                await stream.aclose()  # aborts the engine request if it is still running
                st.decode_s += decoder.decode_s
        # The whole request ends by "length" when any sentence ran out of tokens.
        st.finish_reason = "length" if "length" in (finish_reason, st.finish_reason) else "stop"


@contextmanager
def _engine_errors():
    """Engine exceptions -> the service's own, so the server needs no engine imports."""
    from engine.errors import EngineOverloaded, EngineShutdown, RequestTooLong

    try:
        yield
    except EngineOverloaded as exc:
        raise ServiceOverloaded(str(exc)) from exc
    except RequestTooLong as exc:
        raise InputTooLong(str(exc)) from exc
    except EngineShutdown as exc:
        raise ServiceUnavailable(str(exc)) from exc


# --------------------------------------------------------------------------------------------- service
def _dir_digest(path: Path | None, limit: int = 256 << 20) -> str:
    """A short content hash of a directory's files (size + mtime beyond `limit` bytes)."""
    if path is None or not Path(path).exists():
        return "none"
    h = hashlib.sha1()
    files = sorted(p for p in Path(path).rglob("*") if p.is_file()) if Path(path).is_dir() else [Path(path)]
    total = sum(p.stat().st_size for p in files)
    for p in files:
        h.update(str(p.relative_to(path) if Path(path).is_dir() else p.name).encode())
        h.update(p.read_bytes() if total <= limit else f"{p.stat().st_size}:{p.stat().st_mtime_ns}".encode())
    return h.hexdigest()[:12]


class TTSService:
    def __init__(self, config: TTSConfig, bundle: ModelBundle, family: SpeechFamily, codec: Codec, engine,
                 presets: dict[str, VoicePrompt]):
        self.config = config
        self.bundle = bundle
        self.family = family
        self.codec = codec
        self.engine = engine
        self._presets = presets
        self.sample_rate = int(codec.sample_rate)
        if codec.sample_rate % codec.frame_rate:
            raise ValueError("codec sample_rate must be a multiple of its frame_rate")
        self.hop = codec.sample_rate // codec.frame_rate
        self.model_id = Path(bundle.root).name
        self.codec_key = f"{bundle.codec_name}-{_dir_digest(bundle.codec_dir)}"
        self.batcher = DecodeBatcher(codec, config.max_decode_batch)

    # -- loading
    @classmethod
    def load(cls, config: TTSConfig) -> TTSService:
        """Blocking: loads family, codec, presets and the engine (seconds for the embedded model)."""
        from engine.async_engine import AsyncEngine
        from engine.config import EngineConfig

        bundle = ModelBundle.from_dir(config.model_dir, codec_dir=config.codec_dir, draft_dir=config.draft_dir)
        family = bundle.load_family()
        codec = bundle.load_codec()
        use_draft = config.acceptance != "none" and config.num_speculative_tokens > 0 and bundle.draft_dir
        asg = config.asg_table or bundle.asg_table
        engine_config = EngineConfig(
            target=bundle.target_dir,
            draft=bundle.draft_dir if use_draft else None,
            acceptance=config.acceptance if use_draft else "exact",
            asg_table=asg,
            num_speculative_tokens=config.num_speculative_tokens if use_draft else 0,
            device=config.device,
            kv_budget_tokens=config.kv_budget_tokens,
            max_num_seqs=config.max_num_seqs,
            max_waiting=config.max_waiting,
        )
        engine = AsyncEngine(engine_config)
        service = cls(config, bundle, family, codec, engine, {})
        service._presets = service._load_presets()
        return service

    def _load_presets(self) -> dict[str, VoicePrompt]:
        """Preset voices of the bundle: `<name>.wav` (or .flac) + `<name>.txt` transcript."""
        presets: dict[str, VoicePrompt] = {}
        voices_dir = self.bundle.voices_dir
        if voices_dir is None or not Path(voices_dir).is_dir():
            return presets
        import soundfile as sf

        for audio_path in sorted(Path(voices_dir).glob("*")):
            if audio_path.suffix.lower() not in (".wav", ".flac"):
                continue
            transcript_path = audio_path.with_suffix(".txt")
            transcript = transcript_path.read_text().strip() if transcript_path.exists() else ""
            audio, rate = sf.read(audio_path, dtype="float32", always_2d=True)
            presets[audio_path.stem] = self.encode_voice(audio.mean(axis=1), rate, transcript)
        return presets

    # -- voices
    def preset_voices(self) -> dict[str, VoicePrompt]:
        return dict(self._presets)

    def encode_voice(self, audio: np.ndarray, sample_rate: int, transcript: str) -> VoicePrompt:
        """Blocking: reference clip (float32 [n] mono at sample_rate) -> codes at the codec rate."""
        import soxr

        audio = np.asarray(audio, dtype=np.float32)
        if sample_rate != self.sample_rate:
            audio = soxr.resample(audio, sample_rate, self.sample_rate, quality="HQ").astype(np.float32)
        codes = np.asarray(self.codec.encode(audio), dtype=np.int64)
        return VoicePrompt(codes=codes, transcript=transcript)

    # -- synthesis
    def capabilities(self) -> dict:
        return {
            "sample_rate": self.sample_rate,
            "acceptance": self.engine_acceptance,
            "acceptance_rules": self.acceptance_rules,
            "num_speculative_tokens": self.engine_gamma,
            "asg_table": self.asg_table_name,
            "max_tokens": self.config.max_tokens,
        }

    @property
    def engine_acceptance(self) -> str:
        return self.engine.config.acceptance if self.engine_gamma else "none"

    @property
    def engine_gamma(self) -> int:
        cfg = self.engine.config
        return cfg.num_speculative_tokens if cfg.draft else 0

    @property
    def acceptance_rules(self) -> list[str]:
        """Rules a request may pick; the PCG/LANTERN ones only when an ASG table is loaded."""
        if not self.engine_gamma:
            return ["none"]
        rules = ["exact", "ssd", "topk"]
        if self.engine.config.asg_table:
            rules += ["pcg", "lantern"]
        return rules

    @property
    def asg_table_name(self) -> str | None:
        table = self.engine.config.asg_table
        return Path(table).stem if table else None

    def validate(self, options: SynthesisOptions) -> None:
        if options.acceptance is not None and options.acceptance not in self.acceptance_rules + [
                self.engine_acceptance]:
            raise InvalidOptions(f"acceptance {options.acceptance!r} is not available here; choose one of "
                                 f"{self.acceptance_rules}.", "acceptance")
        if options.num_speculative_tokens is not None and options.num_speculative_tokens != self.engine_gamma:
            raise InvalidOptions(f"this engine runs with num_speculative_tokens={self.engine_gamma}; per-request "
                                 "draft lengths are not supported (set it with --num-speculative-tokens).",
                                 "num_speculative_tokens")
        if options.asg_table is not None and options.asg_table != self.asg_table_name:
            raise InvalidOptions(f"ASG table {options.asg_table!r} is not loaded; the engine serves "
                                 f"{self.asg_table_name!r} (choose another with --asg-table).", "asg_table")

    def sampling_params(self, options: SynthesisOptions, prompt, index: int = 0):
        from engine.config import SamplingParams

        defaults = SamplingParams()
        rule = options.acceptance
        return SamplingParams(
            temperature=defaults.temperature if options.temperature is None else options.temperature,
            top_k=options.top_k if options.top_k is not None else defaults.top_k,
            top_p=options.top_p if options.top_p is not None else defaults.top_p,
            repetition_penalty=options.repetition_penalty or defaults.repetition_penalty,
            max_tokens=options.max_tokens or self.config.max_tokens,
            stop_token_ids=list(prompt.stop_token_ids),
            seed=None if options.seed is None else options.seed + index,  # sentences get distinct seeds
            constraint=prompt.constraint,
            acceptance=None if rule in (None, "none", self.engine_acceptance) else rule,
        )

    def synthesize(self, text: str, voice: VoicePrompt | None, options: SynthesisOptions | None = None
                   ) -> Synthesis:
        """Starts nothing until iterated; raises InvalidOptions / ValueError (nothing to say) at once."""
        options = options or SynthesisOptions()
        self.validate(options)
        segments = split_sentences(text, self.config.sentence_max_chars)
        if not segments:
            raise ValueError("the input holds nothing to speak")
        return Synthesis(self, segments, voice, replace(options))

    # -- monitoring and shutdown
    def engine_stats(self) -> EngineStats:
        raw = self.engine.metrics()
        get = raw.get if isinstance(raw, dict) else (lambda k, d=None: getattr(raw, k, d))
        return EngineStats(
            num_running=int(get("num_running", 0)), num_waiting=int(get("num_waiting", 0)),
            kv_usage=float(get("kv_usage", 0.0)), prompt_tokens=int(get("prompt_tokens", 0)),
            generation_tokens=int(get("generation_tokens", 0)), spec_num_drafts=int(get("spec_num_drafts", 0)),
            spec_drafted_tokens=int(get("spec_drafted_tokens", 0)),
            spec_accepted_tokens=int(get("spec_accepted_tokens", 0)),
            spec_accepted_per_position=[int(v) for v in get("spec_accepted_per_position", []) or []],
            preemptions=int(get("preemptions", 0)))

    def close(self) -> None:
        self.batcher.close()
        shutdown = getattr(self.engine, "shutdown", None) or getattr(self.engine, "close", None)
        if shutdown is not None:
            shutdown()
