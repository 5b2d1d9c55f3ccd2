"""One request's synthesis: its segments generated one after another, streamed as audio chunks."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from pcgtts.engine.codec.base import StreamingDecoder
from pcgtts.engine.speech.base import SpeechPrompt, VoicePrompt, WordSpan
from pcgtts.tts.errors import (
    InputTooLong,
    NothingToSay,
    ServiceOverloaded,
    ServiceUnavailable,
    SynthesisFailed,
)
from pcgtts.tts.feed import TextFeed
from pcgtts.tts.first_audio import FirstAudioPacer

if TYPE_CHECKING:
    from pcgtts.engine.async_engine import TokenDelta
    from pcgtts.engine.config import SamplingParams

log = logging.getLogger("pcgtts.tts")


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
    word_timings: bool = False  # collect where each word is heard (families that align: Synthesis.words)


@dataclass
class SynthesisStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    steps: int = 0  # engine steps that emitted tokens for this request (verify steps when speculating)
    audio_samples: int = 0
    sample_rate: int = 0
    sentences: int = 0
    started_at: float = field(default_factory=time.perf_counter)
    first_token_s: float | None = None  # since `synthesize` was called
    first_audio_s: float | None = None
    finished_s: float | None = None
    decode_s: float = 0.0  # codec time spent on this request's windows
    first_audio_held_s: float = 0.0  # how long the first audio was held back (tts/first_audio.py)
    finish_reason: str | None = None  # stop | length | abort

    @property
    def audio_seconds(self) -> float:
        return self.audio_samples / self.sample_rate if self.sample_rate else 0.0

    def playback_deadline(self) -> float:
        """perf_counter time at which a listener who started at the first chunk runs out of audio;
        0 (before everything else) while the listener has no audio at all."""
        if self.first_audio_s is None:
            return 0.0
        return self.started_at + self.first_audio_s + self.audio_seconds

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else None

    @property
    def mean_accepted_len(self) -> float | None:
        """Tokens emitted per engine step (1.0 target-only, up to γ+1 speculating), as in `pcgtts bench`."""
        return self.generated_tokens / self.steps if self.steps else None


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


@dataclass(frozen=True)
class WordTiming:
    """Where a word of the input is heard, in samples of the synthesis's audio (its `sample_rate`)."""

    text: str
    start: int
    end: int  # exclusive


@dataclass(frozen=True)
class SynthesisContext:
    """Everything a synthesis uses of the TTS service, and nothing more (`TTSService.synthesize` builds
    it): the family's prompt and token mapping, the codec's decoder and the codec threads, the engine's
    stream, the request's sampling parameters and the voice handling."""

    sample_rate: int  # Hz of the codec's audio, so of every chunk
    frame_rate: int  # codec codes per second
    sentence_pause_s: float  # silence between segments
    build_prompt: Callable[[str, VoicePrompt | None], SpeechPrompt]  # ValueError: nothing speakable
    tokens_to_codes: Callable[[Sequence[int]], np.ndarray]
    sampling_params: Callable[[SynthesisOptions, SpeechPrompt, int], SamplingParams]  # (.., segment index)
    streaming_decoder: Callable[[], StreamingDecoder]
    # (decoder, codes or None to flush, playback deadline) -> (final audio so far, codec seconds charged)
    decode: Callable[[StreamingDecoder, np.ndarray | None, float], Awaitable[tuple[np.ndarray, float]]]
    # (prompt ids, params, request id, continuing=) -> the engine's token deltas; closing it aborts
    stream: Callable[..., AsyncIterator[TokenDelta]]
    set_deadline: Callable[[str, float | None], None]  # (request id, when its listener runs dry)
    encode_voice: Callable[[np.ndarray, int, str], VoicePrompt]  # blocking: clip, rate, transcript
    pin_voice: Callable[[VoicePrompt], None]  # blocking: keep a non-preset voice's prefix cached
    first_audio_max_hold_s: float = 0.0  # the longest a stream's first audio is held (0: never held)


@dataclass
class ReferenceClip:
    """A voice to clone given as audio (e.g. a request's inline reference): the synthesis encodes it to
    codec codes, off the event loop, before its first segment."""

    audio: np.ndarray  # float32 [samples], mono
    sample_rate: int
    transcript: str


class Synthesis:
    """An async iterator of float32 audio chunks for one request; `aclose()` aborts it."""

    def __init__(self, context: SynthesisContext, segments: list[str] | TextFeed,
                 voice: VoicePrompt | ReferenceClip | None, options: SynthesisOptions):
        """segments: the input's, or a TextFeed whose segments are spoken as they become ready."""
        self._ctx = context
        self._segments = segments
        self._voice = voice
        self._options = options
        self.sample_rate = context.sample_rate  # Hz of every chunk
        self.stats = SynthesisStats(sample_rate=context.sample_rate)
        self._admitted = False  # admission is decided once, at the first sentence; later ones continue
        self.words: list[WordTiming] = []  # with options.word_timings: each word once its span is known
        self._words_taken = 0
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

    def take_words(self) -> list[WordTiming]:
        """The words whose timing became known since the last call (they lead the audio: their tokens are
        generated before the codec turns them into sound)."""
        new = self.words[self._words_taken:]
        self._words_taken = len(self.words)
        return new

    async def aclose(self) -> None:
        """Stops generation; the engine request is aborted and its KV blocks freed."""
        await self._gen.aclose()
        if self.stats.finish_reason is None:
            self.stats.finish_reason = "abort"

    async def _prompt(self, segment: str) -> SpeechPrompt | None:
        """The segment's prompt, built off the event loop (the text front end takes milliseconds)."""
        try:
            return await asyncio.to_thread(self._ctx.build_prompt, segment, self._voice)
        except ValueError:  # e.g. a segment of only symbols: skip it, the rest still speaks
            log.info("skipping unspeakable segment %r", segment)
            return None

    async def _segment_source(self) -> AsyncIterator[str]:
        if isinstance(self._segments, list):
            for segment in self._segments:
                yield segment
        else:
            async for segment in self._segments.segments():
                yield segment

    async def _generate(self) -> AsyncIterator[np.ndarray]:
        ctx = self._ctx
        if isinstance(clip := self._voice, ReferenceClip):  # a one-off clip: cached, not pinned
            self._voice = await asyncio.to_thread(ctx.encode_voice, clip.audio, clip.sample_rate,
                                                  clip.transcript)
        elif self._voice is not None:
            await asyncio.to_thread(ctx.pin_voice, self._voice)
        pause = np.zeros(int(ctx.sentence_pause_s * ctx.sample_rate), np.float32)
        fade = int(0.005 * ctx.sample_rate)
        spoken, index = 0, 0
        async with aclosing(self._segment_source()) as source:
            segment = await anext(source, None)
            while segment is not None:
                prompt = await self._prompt(segment)
                if prompt is None:
                    segment, index = await anext(source, None), index + 1
                    continue
                if spoken and pause.size:
                    yield pause
                # Only the sentence's latest `fade` samples are held back (to fade its end once it is
                # known): holding back a whole chunk delayed the first audio until the codec's second block.
                tail, started = np.zeros(0, np.float32), False
                offset = self.stats.audio_samples  # the segment's first sample: what went before is out
                async with aclosing(self._sentence(index, prompt, offset)) as chunks:
                    async for chunk in chunks:
                        if spoken and not started:
                            chunk = _fade_edges(chunk, fade, fade_in=True, fade_out=False)
                        started = True
                        joined = np.concatenate([tail, chunk])
                        cut = max(0, joined.size - fade)
                        if cut:
                            yield joined[:cut]
                        tail = joined[cut:]
                # the end fades out when another segment follows (a feed's may still be being written)
                segment, index = await anext(source, None), index + 1
                if tail.size:
                    yield _fade_edges(tail, fade, fade_in=False, fade_out=segment is not None)
                spoken += 1
                self.stats.sentences += 1
        if not spoken:
            raise NothingToSay("the input holds nothing this model can speak")
        self.stats.finished_s = time.perf_counter() - self.stats.started_at

    async def _decode(self, decoder: StreamingDecoder, codes: np.ndarray | None) -> np.ndarray:
        """Codes -> final audio on the service's codec threads (codes None flushes the decoder)."""
        try:
            audio, took = await self._ctx.decode(decoder, codes, self.stats.playback_deadline())
        except Exception as exc:  # this stream's own (the pool isolates streams); the others go on
            raise SynthesisFailed(f"decoding its audio failed: {type(exc).__name__}: {exc}") from exc
        self.stats.decode_s += took
        return audio

    def _add_words(self, spans: list[WordSpan], offset: int) -> None:
        """A segment's word spans (codec frames) -> timings in the synthesis's samples."""
        per_frame = self.sample_rate / self._ctx.frame_rate
        self.words += [WordTiming(w.text, offset + round(w.start_frame * per_frame),
                                  offset + round(w.end_frame * per_frame)) for w in spans]

    async def _sentence(self, index: int, prompt: SpeechPrompt, offset: int) -> AsyncIterator[np.ndarray]:
        """One segment's audio; `offset`: its first sample in the synthesis (for its word timings)."""
        ctx, opts, st = self._ctx, self._options, self.stats
        aligner = prompt.word_aligner if opts.word_timings else None
        params = ctx.sampling_params(opts, prompt, index)
        st.prompt_tokens += len(prompt.token_ids)
        decoder = ctx.streaming_decoder()
        held: list[np.ndarray] = []  # codes not yet given to the decoder (all of them when not streaming)
        finish_reason = None
        request_id = uuid.uuid4().hex
        coded, voiced, frame_rate = 0, 0, ctx.frame_rate  # this sentence's codes and audio samples
        pacer = None  # holds the synthesis's first audio until the stream can follow it up in time
        if opts.streaming and st.first_audio_s is None and ctx.first_audio_max_hold_s > 0:
            pacer = FirstAudioPacer(ctx.first_audio_max_hold_s, self.sample_rate)
        with _engine_errors():
            stream = ctx.stream(prompt.token_ids, params, request_id, continuing=self._admitted)
            try:
                async for delta in stream:
                    self._admitted = True
                    if delta.token_ids and st.first_token_s is None:
                        st.first_token_s = time.perf_counter() - st.started_at
                    st.generated_tokens += len(delta.token_ids)
                    st.steps += bool(delta.token_ids)  # one delta per engine step
                    st.drafted_tokens += delta.num_drafted
                    st.accepted_tokens += delta.num_accepted
                    if aligner is not None:
                        self._add_words(aligner.push(delta.token_ids), offset)
                    codes = ctx.tokens_to_codes(delta.token_ids)
                    if codes.size:
                        held.append(codes)
                        coded += codes.size
                        if pacer is not None:
                            pacer.codes_arrived(codes.size, time.perf_counter())
                    if delta.finished:
                        finish_reason = delta.finish_reason
                        break
                    if opts.streaming and held:
                        sent = time.perf_counter()
                        audio = await self._decode(decoder, np.concatenate(held))
                        held = []
                        if pacer is not None:
                            now = time.perf_counter()
                            pacer.hold(audio, now)
                            audio = pacer.release(decoder.codes_until_audio(), now - sent, now)
                            if audio is None:
                                continue
                            st.first_audio_held_s, pacer = pacer.held_s, None
                        if audio.size:
                            yield audio
                            voiced += audio.size
                        if st.first_audio_s is not None:
                            # tell the scheduler how far ahead of its listener this stream is: audio sent
                            # plus codes generated that the codec has not turned into audio yet
                            # (audio-deadline scheduling)
                            undecoded_s = max(0.0, coded / frame_rate - voiced / self.sample_rate)
                            ctx.set_deadline(request_id, st.playback_deadline() + undecoded_s)
            finally:
                await stream.aclose()  # aborts the engine request if it is still running
        if aligner is not None:
            self._add_words(aligner.finish(), offset)
        if pacer is not None and (audio := pacer.take(time.perf_counter())).size:
            st.first_audio_held_s = pacer.held_s
            yield audio
        if held:
            audio = await self._decode(decoder, np.concatenate(held))
            if audio.size:
                yield audio
        audio = await self._decode(decoder, None)
        if audio.size:
            yield audio
        # The whole request ends by "length" when any sentence ran out of tokens.
        st.finish_reason = "length" if "length" in (finish_reason, st.finish_reason) else "stop"


@contextmanager
def _engine_errors():
    """Engine exceptions -> the service's own, so the server needs no engine imports."""
    from pcgtts.engine.errors import (
        EngineFault,
        EngineOverloaded,
        EngineShutdown,
        RequestFailed,
        RequestTooLong,
    )

    try:
        yield
    except EngineOverloaded as exc:
        raise ServiceOverloaded(str(exc)) from exc
    except RequestTooLong as exc:
        raise InputTooLong(str(exc)) from exc
    except (EngineShutdown, EngineFault) as exc:
        raise ServiceUnavailable(str(exc)) from exc
    except RequestFailed as exc:
        raise SynthesisFailed(str(exc)) from exc
