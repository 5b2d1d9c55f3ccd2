"""Prometheus metrics for /metrics: engine counters under vLLM's names with our `pcgtts:` prefix, plus
audio SLOs (time to first audio, real-time factor, underrun) measured by the server per request.

Engine state is read at scrape time through `engine_stats()` (a snapshot the TTS service returns), so
the numbers are never stale and the engine needs no Prometheus code. Every family carries a
`model_name` label and nothing with unbounded cardinality (no voice or request ids).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

PREFIX = "pcgtts:"
# Resolution below 300 ms, where time-to-first-audio targets live.
TTFA_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0)
RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0,
                   300.0)
UNDERRUN_BUCKETS = (0.0, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
# Audio a listener holds when the next chunk arrives (live capacity headroom: near 0 = about to stall).
HEADROOM_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
# A stream whose worst stall stays below this is "continuous" (vLLM-Omni's threshold).
CONTINUITY_THRESHOLD_S = 0.1


@dataclass
class RequestOutcome:
    """What one finished speech request reports to the metrics."""

    format: str
    stream_mode: str  # audio | sse | full | websocket
    status: str  # ok | error | refused (429: at capacity) | aborted
    finished_reason: str | None = None  # stop | length | abort
    ttfa_s: float | None = None  # request received -> first audio bytes out
    first_token_s: float | None = None
    e2e_s: float | None = None
    audio_s: float = 0.0
    underrun_s: float | None = None
    first_audio_held_s: float | None = None  # how long the first audio was held back (tts/first_audio.py)


class UnderrunTracker:
    """Worst stall a player would hear if it started playing the first chunk on arrival.

    After chunk i arrives at t_i the player has (audio so far) - (t_i - t_0) seconds buffered; a negative
    value before a chunk's arrival is a stall.
    """

    def __init__(self):
        self.t0: float | None = None
        self.audio_s = 0.0
        self.worst = 0.0

    def chunk(self, now: float, seconds: float) -> float | None:
        """Records a chunk; returns the audio the player still held when it arrived (None for the first,
        negative when it had run dry)."""
        headroom = None
        if self.t0 is None:
            self.t0 = now
        else:
            headroom = self.audio_s - (now - self.t0)
            self.worst = max(self.worst, -headroom)
        self.audio_s += seconds
        return headroom


class EngineCollector:
    """Exports the engine's snapshot as vLLM-named gauges and counters, and the codec threads' totals."""

    def __init__(self, model_name: str, engine_stats: Callable[[], object | None],
                 codec_stats: Callable[[], object | None] = lambda: None):
        self._model = model_name
        self._stats = engine_stats
        self._codec = codec_stats

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        if s is None:  # the model is still loading
            return
        labels = ["model_name"]
        for name, doc, value in (
            ("num_requests_running", "Requests in the running batch.", s.num_running),
            ("num_requests_waiting", "Requests waiting for a batch slot.", s.num_waiting),
            ("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1).", s.kv_usage),
        ):
            g = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
            g.add_metric([self._model], float(value))
            yield g
        for name, doc, value in (
            ("prompt_tokens", "Prompt tokens prefilled.", s.prompt_tokens),
            ("generation_tokens", "Tokens generated (emitted).", s.generation_tokens),
            ("num_preemptions", "Sequences preempted for lack of KV blocks.", s.preemptions),
            ("spec_decode_num_drafts", "Speculative steps (one per sequence per step).", s.spec_num_drafts),
            ("spec_decode_num_draft_tokens", "Draft tokens proposed.", s.spec_drafted_tokens),
            ("spec_decode_num_accepted_tokens", "Draft tokens accepted.", s.spec_accepted_tokens),
            ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", s.prefix_cache_queries),
            ("prefix_cache_hits", "Prompt tokens whose K/V came from the prefix cache.", s.prefix_cache_hits),
        ):
            c = CounterMetricFamily(PREFIX + name, doc, labels=labels)
            c.add_metric([self._model], float(value))
            yield c
        steps = CounterMetricFamily(PREFIX + "decode_steps", "Engine decode steps by mode (the speculation "
                                    "policy picks speculative or target-only per step).",
                                    labels=["model_name", "mode"])
        steps.add_metric([self._model, "speculative"], float(s.speculative_steps))
        steps.add_metric([self._model, "target_only"], float(s.target_only_steps))
        yield steps
        by_length = CounterMetricFamily(PREFIX + "decode_steps_by_draft_length", "Engine decode forwards by "
                                        "the draft length they ran (0: target alone; the speculation policy "
                                        "picks one per step and batch size).",
                                        labels=["model_name", "draft_length"])
        for length, value in s.steps_by_draft_length.items():
            by_length.add_metric([self._model, str(length)], float(value))
        yield by_length
        per_pos = CounterMetricFamily(PREFIX + "spec_decode_num_accepted_tokens_per_pos",
                                      "Draft tokens accepted, by draft position.",
                                      labels=["model_name", "position"])
        for position, value in enumerate(s.spec_accepted_per_position):
            per_pos.add_metric([self._model, str(position)], float(value))
        yield per_pos
        codec = self._codec()
        if codec is None:
            return
        for name, doc, value in (
            ("codec_decode_calls", "Codec decode calls (each serves one or more streams).", codec.calls),
            ("codec_decode_stream_jobs", "Stream jobs served by codec calls (/ calls = mean batch).",
             codec.stream_jobs),
            ("codec_decode_seconds", "Seconds spent in codec decode calls.", codec.seconds),
            ("codec_process_restarts", "Codec processes that died and were replaced (their streams failed).",
             codec.process_restarts),
        ):
            c = CounterMetricFamily(PREFIX + name, doc, labels=labels)
            c.add_metric([self._model], float(value))
            yield c


class ServerMetrics:
    def __init__(self, model_name: str, engine_stats: Callable[[], object | None],
                 codec_stats: Callable[[], object | None] = lambda: None):
        self.model_name = model_name
        self.registry = CollectorRegistry()
        r, lab = self.registry, ["model_name"]
        self.ttfa = Histogram(PREFIX + "audio_time_to_first_chunk_seconds",
                              "Request received -> first audio bytes sent.", lab, buckets=TTFA_BUCKETS,
                              registry=r)
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds",
                              "Request received -> first speech token generated.", lab, buckets=TTFA_BUCKETS,
                              registry=r)
        self.first_audio_hold = Histogram(
            PREFIX + "audio_first_chunk_hold_seconds",
            "How long a stream's first audio was held back so that the next chunk could follow it without "
            "a gap (0 = sent at once; a loaded server holds).", lab, buckets=(0.0,) + TTFA_BUCKETS,
            registry=r)
        self.rtf = Histogram(PREFIX + "audio_rtf", "Wall time / audio duration per request (lower = faster).",
                             lab, buckets=RTF_BUCKETS, registry=r)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "Request received -> last byte sent.",
                             lab, buckets=LATENCY_BUCKETS, registry=r)
        self.underrun = Histogram(PREFIX + "audio_underrun_seconds",
                                  "Worst playback stall of a stream started at its first chunk.", lab,
                                  buckets=UNDERRUN_BUCKETS, registry=r)
        self.headroom = Histogram(PREFIX + "audio_buffer_headroom_seconds",
                                  "Audio a listener started at the first chunk still holds when the next "
                                  "chunk is sent (0 = it ran dry): live real-time capacity headroom.", lab,
                                  buckets=HEADROOM_BUCKETS, registry=r)
        self.streams_active = Gauge(PREFIX + "audio_streams_active",
                                    "Requests that have started sending audio and not yet finished.", lab,
                                    registry=r)
        self.continuity_ok = Counter(PREFIX + "audio_continuity_ok",
                                     f"Streams whose worst stall stayed below {CONTINUITY_THRESHOLD_S} s.",
                                     lab, registry=r)
        self.audio_seconds = Counter(PREFIX + "audio_seconds", "Seconds of audio produced.", lab, registry=r)
        self.requests = Counter(PREFIX + "requests", "Speech requests by format, stream mode and status "
                                "(ok, error, refused: 429 at capacity, aborted: the client left).",
                                ["model_name", "format", "stream_mode", "status"], registry=r)
        self.success = Counter(PREFIX + "request_success", "Finished speech requests by finish reason.",
                               ["model_name", "finished_reason"], registry=r)
        self.registry.register(EngineCollector(model_name, engine_stats, codec_stats))

    def record(self, o: RequestOutcome) -> None:
        m = self.model_name
        self.requests.labels(m, o.format, o.stream_mode, o.status).inc()
        if o.finished_reason:
            self.success.labels(m, o.finished_reason).inc()
        if o.ttfa_s is not None:
            self.ttfa.labels(m).observe(o.ttfa_s)
        if o.first_token_s is not None:
            self.ttft.labels(m).observe(o.first_token_s)
        if o.first_audio_held_s is not None:
            self.first_audio_hold.labels(m).observe(o.first_audio_held_s)
        if o.e2e_s is not None:
            self.e2e.labels(m).observe(o.e2e_s)
        if o.audio_s > 0:
            self.audio_seconds.labels(m).inc(o.audio_s)
            if o.e2e_s is not None and o.status == "ok":
                self.rtf.labels(m).observe(o.e2e_s / o.audio_s)
        if o.underrun_s is not None and o.status == "ok":
            self.underrun.labels(m).observe(o.underrun_s)
            if o.underrun_s < CONTINUITY_THRESHOLD_S:
                self.continuity_ok.labels(m).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
