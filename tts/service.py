"""The TTS service: text + voice in, streamed audio out. The TTS layer's entry point.

`TTSService.load(TTSConfig(...))` opens a model bundle (speech family, codec, target/draft models) and
starts an `AsyncEngine`, whose step loop runs in its own thread. `synthesize(text, voice, options)`
returns a `Synthesis`, an async iterator of float32 audio chunks at the codec's rate:

* long text is split into sentences (the family's own splitter when it has one), generated one after
  another within the same stream, joined by a short pause;
* speech tokens stream from the engine into the codec's streaming decoder, which decodes overlapping
  blocks and cross-fades them, so streamed audio equals a one-pass decode and joins are inaudible;
  audio leaves as soon as the codec has a final block;
* the codec work of all live streams runs on `DecodePool` threads (one by default), so the event loop
  never runs model code;
* closing the iterator (`aclose`) aborts the engine request and frees its KV blocks;
* text that is still arriving (a voice agent's LLM writing) goes into a `text_feed()`, whose synthesis
  speaks each sentence once it is complete, as one utterance;
* with `SynthesisOptions.word_timings`, families that know their alignment say where each word is heard
  (`Synthesis.words`).

Per-request statistics (time to first audio, tokens, drafted/accepted, audio seconds) are on
`Synthesis.stats`; the engine's counters on `TTSService.engine_stats()`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

import numpy as np
import soundfile as sf
from pcgtts.engine.codec.base import Codec
from pcgtts.engine.config import EngineConfig
from pcgtts.engine.metrics import EngineMetrics
from pcgtts.engine.speech.base import SpeechFamily, VoicePrompt
from pcgtts.engine.streaming import StreamingEngine
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle
from pcgtts.tts.codec_process import CodecRecipe
from pcgtts.tts.decode_pool import CodecStats, DecodePool
from pcgtts.tts.errors import InvalidOptions, NothingToSay
from pcgtts.tts.feed import TextFeed
from pcgtts.tts.synthesis import ReferenceClip, Synthesis, SynthesisContext, SynthesisOptions
from pcgtts.tts.text import sentences_of, split_long, split_sentences


# ----------------------------------------------------------------------------------------------- config
@dataclass
class TTSConfig:
    """How the service loads its model and streams audio. Every default suits a 2-core CPU; the engine's
    own settings default to EngineConfig's (one definition each; the server's settings refer to these)."""

    model_dir: str | Path = DEFAULT_MODEL_DIR
    codec_dir: str | Path | None = None  # overrides the bundle's codec
    draft_dir: str | Path | None = None  # overrides the bundle's draft
    semantic_model: str | Path | None = None  # X-codec2's w2v-bert-2.0 directory (encoding voice clips)
    device: str = EngineConfig.device
    # Which engine decodes: "builtin" (engine/, every device, the default) or "vllm" (vLLM's AsyncLLM with
    # our rules in its sampler, engine/vllm/: for GPUs; `make install-vllm`). The service drives both
    # through one streaming interface (`stream`, `abort`, `metrics`, `fault`, `shutdown`).
    engine: str = "builtin"
    acceptance: str = "pcg"  # "none" decodes with the target alone
    num_speculative_tokens: int = EngineConfig.num_speculative_tokens  # γ
    draft_confidence: float = EngineConfig.draft_confidence  # θ of the confidence-following draft length
    draft_branches: int = EngineConfig.draft_branches  # k of a token tree (engine/spec_tree.py); 1: a chain
    # "auto": the engine speculates on a step only when that measured faster at its batch size;
    # "always": every step. Seeded requests speculate on every step either way (reproducible audio).
    speculation: str = "auto"
    # more draft lengths "auto" may choose per batch size (EngineConfig.speculation_lengths; builtin engine)
    speculation_lengths: tuple[int, ...] = EngineConfig.speculation_lengths
    asg_table: str | Path | None = None  # overrides the bundle's ASG table (θ choice)
    extra_asg_tables: dict[str, str | Path] = field(default_factory=dict)  # more, picked per request by name
    kv_budget_tokens: int | None = EngineConfig.kv_budget_tokens
    max_num_seqs: int = EngineConfig.max_num_seqs
    max_waiting: int = EngineConfig.max_waiting
    decode_graphs: str = EngineConfig.decode_graphs  # eager | compile | cuda_graphs | auto (EngineConfig)
    compile_cache_dir: str | Path | None = None  # inductor's cache for decode_graphs=compile
    kv_mirror_mb: int = EngineConfig.kv_mirror_bytes >> 20  # eager CPU: contiguous per-row K/V, MiB per model
    deterministic: str = EngineConfig.deterministic  # batch-invariant forwards: seeded | always | off
    cpu_attention: str = EngineConfig.cpu_attention  # eager CPU attention: rows | sdpa (EngineConfig)
    cpu_weights: str = EngineConfig.cpu_weights  # eager CPU products: auto | fp16 | fp32 | bf16 | int8
    cpu_kv: str = EngineConfig.cpu_kv  # eager CPU rows-attention K/V store: fp16 | fp32 (EngineConfig)
    max_tokens: int = 1000  # default cap on generated tokens per sentence
    decode_threads: int = 1  # codec threads; more only helps with spare cores and many streams
    # Where the codec runs: "process" (a child process per codec thread: the codec and the engine do not
    # wait for each other's interpreter lock, tts/codec_process.py), "thread" (in this process), or "auto"
    # (a process on the CPU device; on CUDA the codec shares the engine's GPU context in-process).
    codec_process: str = "auto"
    # Frames of the first codec block (smaller: earlier first audio, thinner early buffer); None = the
    # codec's own. Only block codecs (the demo codec) have one.
    initial_codec_chunk_frames: int | None = None
    # The longest a stream's first audio is held back so that the next chunk follows it in time (the
    # listener's wait comes before the first sound, not after it: tts/first_audio.py); 0 = never held.
    first_audio_max_hold_s: float = 0.3
    sentence_max_chars: int = 220
    sentence_pause_s: float = 0.12  # silence between sentences of one input


ENGINES = ("builtin", "vllm")
CODEC_PLACES = ("auto", "process", "thread")


def _codec_recipe(config: TTSConfig) -> CodecRecipe | None:
    """How a codec process loads the service's codec, or None where the codec runs on the service's threads
    (TTSConfig.codec_process)."""
    if config.codec_process not in CODEC_PLACES:
        raise ValueError(f"codec_process must be one of {CODEC_PLACES}, not {config.codec_process!r}")
    if config.codec_process == "thread" or (config.codec_process == "auto" and config.device != "cpu"):
        return None
    import torch

    return CodecRecipe(model_dir=Path(config.model_dir),
                       codec_dir=Path(config.codec_dir) if config.codec_dir else None,
                       first_block_frames=config.initial_codec_chunk_frames,
                       torch_threads=torch.get_num_threads())


def _vllm_engine(config: TTSConfig, engine_config: EngineConfig, family: SpeechFamily):
    """vLLM behind the service, for a family whose decode constraint vLLM can apply (a fixed token set, as
    allowed_token_ids); a constraint that depends on the tokens before each position (the demo family's
    marker merge) would have to run inside vLLM's verification for target and draft alike, which vLLM 0.32
    has no place for, so such a family is refused here with the reason."""
    from pcgtts.engine.vllm.engine import VllmEngine, VllmOptions

    if engine_config.draft_confidence:
        raise ValueError("--draft-confidence is a builtin-engine setting: vLLM drafts its fixed γ for every "
                         "request (serve without it, or with --engine builtin)")
    if engine_config.draft_branches > 1:
        raise ValueError("--draft-branches is a builtin-engine setting: vLLM verifies one chain of drafts "
                         "per request (serve without it, or with --engine builtin)")
    if engine_config.speculation_lengths:
        raise ValueError("--speculation-lengths is a builtin-engine setting: vLLM drafts its fixed γ on "
                         "every step (serve without it, or with --engine builtin)")
    try:
        probe = family.build_prompt("hello", None)
    except ValueError:
        probe = None
    constraint = probe.constraint if probe is not None else None
    if constraint is not None and constraint.allowed_token_ids is None:
        raise ValueError(f"the {family.name} family constrains each position by the tokens before it "
                         f"({type(constraint).__name__}), which vLLM cannot apply inside its verification; "
                         "serve it with --engine builtin (the vLLM engine serves Llasa-style families)")
    return VllmEngine(engine_config, VllmOptions(allowed_token_ids=family.speech_token_ids()))


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
    def __init__(self, config: TTSConfig, bundle: ModelBundle, family: SpeechFamily, codec: Codec,
                 engine: StreamingEngine, presets: dict[str, VoicePrompt],
                 codec_recipe: CodecRecipe | None = None):
        self.config = config
        self.bundle = bundle
        self.family = family
        self.codec = codec
        self.engine = engine
        self._presets = presets
        self.sample_rate = int(codec.sample_rate)
        self.model_id = Path(bundle.root).name
        self.codec_key = f"{bundle.codec_name}-{_dir_digest(bundle.codec_dir)}"
        self.decoder = DecodePool(codec, config.decode_threads, process=codec_recipe)
        self._voice_prefixes: OrderedDict[bytes, list[int]] = OrderedDict()  # non-preset voice -> prefix
        self._voice_prefixes_lock = threading.Lock()  # pin_voice runs on worker threads, several at once

    # -- loading
    @classmethod
    def load(cls, config: TTSConfig) -> TTSService:
        """Blocking: loads family, codec, presets and the engine (seconds for the embedded model)."""
        from pcgtts.engine.async_engine import AsyncEngine

        if config.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, not {config.engine!r}")
        if not config.first_audio_max_hold_s >= 0:
            raise ValueError(f"first_audio_max_hold_s must be >= 0, not {config.first_audio_max_hold_s}")
        bundle = ModelBundle.from_dir(config.model_dir, codec_dir=config.codec_dir,
                                      draft_dir=config.draft_dir)
        family = bundle.load_family()
        codec = bundle.load_codec(device=config.device, semantic_model=config.semantic_model)
        if config.initial_codec_chunk_frames is not None:
            codec.set_first_block_frames(config.initial_codec_chunk_frames)
        recipe = _codec_recipe(config)
        use_draft = config.acceptance != "none" and config.num_speculative_tokens > 0 and bundle.draft_dir
        asg = config.asg_table or bundle.asg_table
        engine_config = EngineConfig(
            target=bundle.target_dir,
            draft=bundle.draft_dir if use_draft else None,
            acceptance=config.acceptance if use_draft else "exact",
            asg_table=asg,
            extra_asg_tables=bundle.extra_asg_tables | dict(config.extra_asg_tables),
            num_speculative_tokens=config.num_speculative_tokens if use_draft else 0,
            draft_confidence=config.draft_confidence,
            draft_branches=config.draft_branches,
            speculation=config.speculation,
            speculation_lengths=tuple(config.speculation_lengths),
            device=config.device,
            kv_budget_tokens=config.kv_budget_tokens,
            max_num_seqs=config.max_num_seqs,
            max_waiting=config.max_waiting,
            decode_graphs=config.decode_graphs,
            compile_cache_dir=config.compile_cache_dir,
            kv_mirror_bytes=config.kv_mirror_mb << 20,
            deterministic=config.deterministic,
            cpu_attention=config.cpu_attention,
            cpu_weights=config.cpu_weights,
            cpu_kv=config.cpu_kv,
        )
        engine = AsyncEngine(engine_config) if config.engine == "builtin" else \
            _vllm_engine(config, engine_config, family)
        service = cls(config, bundle, family, codec, engine, {}, codec_recipe=recipe)
        try:
            service._presets = service._load_presets()
            service._pin_presets()
            _ = service.default_sampling  # a bad manifest fails at load, not on the first request
            service.decoder.wait_ready()  # a codec process that cannot load fails start-up, not a request
        except BaseException:
            service.decoder.close()
            raise
        return service

    def _load_presets(self) -> dict[str, VoicePrompt]:
        """Preset voices: the family's own (`family.preset_voices()`, e.g. the demo family's codes +
        transcript files), else, in the bundle's voices directory, `<name>.json` ({"codes": [...],
        "transcript": ...}, codes already encoded: a decode-only codec serves them) and `<name>.wav|.flac`
        (+ `<name>.txt` transcript), encoded here."""
        own = self.family.preset_voices()
        if own:
            return own
        presets: dict[str, VoicePrompt] = {}
        voices_dir = self.bundle.voices_dir
        files = sorted(Path(voices_dir).glob("*")) if voices_dir and Path(voices_dir).is_dir() else []
        for path in files:
            if path.suffix.lower() == ".json":
                spec = json.loads(path.read_text())
                presets[path.stem] = VoicePrompt(codes=np.asarray(spec["codes"], dtype=np.int64),
                                                 transcript=str(spec.get("transcript", "")))
            elif path.suffix.lower() in (".wav", ".flac"):
                transcript_path = path.with_suffix(".txt")
                transcript = transcript_path.read_text().strip() if transcript_path.exists() else ""
                audio, rate = sf.read(path, dtype="float32", always_2d=True)
                presets[path.stem] = self.encode_voice(audio.mean(axis=1), rate, transcript)
        return presets

    def _pin_presets(self) -> None:
        """Keep each preset voice's prompt prefix (its reference codes) in the engine's prefix cache for
        good."""
        for voice in self._presets.values():
            if prefix := self._voice_prefix(voice):
                self.engine.pin_prefix(prefix)

    def pin_voice(self, voice: VoicePrompt) -> None:
        """Called per request with a voice that is not a preset (an uploaded one): pin its prompt prefix
        too, least recently used first out when the engine's pin budget is full, so a popular uploaded
        voice stays cached like a preset."""
        if any(voice is p for p in self._presets.values()):
            return
        key = hashlib.blake2b(np.ascontiguousarray(voice.codes).tobytes() + voice.transcript.encode(),
                              digest_size=16).digest()
        with self._voice_prefixes_lock:
            prefix = self._voice_prefixes.pop(key, None)
        if prefix is None:
            prefix = self._voice_prefix(voice)
        with self._voice_prefixes_lock:
            self._voice_prefixes[key] = prefix
            while len(self._voice_prefixes) > 256:
                self._voice_prefixes.popitem(last=False)
        if prefix:
            self.engine.pin_prefix(prefix, lru=True)

    def _voice_prefix(self, voice: VoicePrompt) -> list[int]:
        """The prefix every prompt in this voice starts with (its reference codes): the common prefix of
        two prompts with different texts."""
        try:
            a = self.family.build_prompt("one", voice).token_ids
            b = self.family.build_prompt("two", voice).token_ids
        except ValueError:
            return []
        common = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        return list(a[:common])

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
    @property
    def engine_name(self) -> str:
        """Which engine decodes ("builtin" or "vllm")."""
        return self.engine.name

    def capabilities(self) -> dict:
        return {
            "engine": self.engine_name,
            "codec_sample_rate": self.sample_rate,
            "acceptance": self.engine_acceptance,
            "acceptance_rules": self.acceptance_rules,
            "num_speculative_tokens": self.engine_num_speculative_tokens,
            "asg_table": self.asg_table_name,
            "asg_tables": self.asg_table_names,
            "max_tokens": self.config.max_tokens,
            "sampling_defaults": dict(self.bundle.sampling),
            "limits": self.limits,
            "word_timings": self.family.aligns_words,  # false: requests asking for them get none
        }

    @property
    def min_max_tokens(self) -> int:
        """The smallest max_tokens that makes audio: the family's tokens before its first code, plus one."""
        return self.family.tokens_before_audio + 1

    @property
    def limits(self) -> dict[str, dict[str, int]]:
        """The bounds this model puts on per-request options ({option: {"minimum", "maximum"}}), those
        `validate` enforces beyond any model's; num_speculative_tokens is absent without a draft."""
        limits = {"top_k": {"minimum": 0, "maximum": self.engine.vocab_size},
                  "max_tokens": {"minimum": self.min_max_tokens}}
        most = self.engine_num_speculative_tokens
        if most:  # an engine without per-request γ (vLLM) verifies its own γ only
            fixed = not self.engine.per_request_gamma
            limits["num_speculative_tokens"] = {"minimum": most if fixed else 1, "maximum": most}
        return limits

    @cached_property
    def default_sampling(self):
        """SamplingParams defaults with the bundle's own (e.g. the demo model's temperature) applied."""
        from pcgtts.engine.config import SamplingParams

        try:
            return replace(SamplingParams(), **self.bundle.sampling)
        except TypeError as exc:
            raise ValueError(f"bad 'sampling' in {self.bundle.root}'s manifest: {exc}") from exc

    @property
    def engine_acceptance(self) -> str:
        return self.engine.config.acceptance if self.engine_num_speculative_tokens else "none"

    @property
    def engine_num_speculative_tokens(self) -> int:
        cfg = self.engine.config
        return cfg.num_speculative_tokens if cfg.draft else 0

    @property
    def acceptance_rules(self) -> list[str]:
        """Rules a request may pick; those that use an ASG table (pcg, pcg-block, lantern) only when one is
        loaded."""
        from pcgtts.engine.acceptance import uses_asg_table

        if not self.engine_num_speculative_tokens:
            return ["none"]
        # token-level rules first; an engine may serve fewer (vLLM: exact and pcg)
        rules = sorted(self.engine.acceptance_rules, key=uses_asg_table)
        return [rule for rule in rules if self.asg_table_names or not uses_asg_table(rule)]

    @cached_property
    def asg_table_name(self) -> str | None:
        """The default ASG table's name: the one its build recorded (the embedded model's: mel-0.35), else
        its file's stem."""
        from pcgtts.asg_tables import ASGTable

        table = self.engine.config.asg_table
        return ASGTable.name_of(table) if table else None

    @property
    def asg_table_names(self) -> list[str]:
        """Every ASG table a request may pick, the default first."""
        return [*([self.asg_table_name] if self.asg_table_name else []), *self.engine.config.extra_asg_tables]

    def validate(self, options: SynthesisOptions) -> None:
        if options.acceptance is not None and options.acceptance not in self.acceptance_rules + [
                self.engine_acceptance]:
            raise InvalidOptions(f"acceptance {options.acceptance!r} is not available here; choose one of "
                                 f"{self.acceptance_rules}.", "acceptance")
        gamma, most = options.num_speculative_tokens, self.engine_num_speculative_tokens
        if gamma is not None and gamma != most and not self.engine.per_request_gamma:
            raise InvalidOptions(f"num_speculative_tokens is fixed at {most} on the "
                                 f"{self.engine_name} engine (it verifies the same γ for every request).",
                                 "num_speculative_tokens")
        if gamma is not None and not (gamma == most or 1 <= gamma <= most):
            raise InvalidOptions(f"num_speculative_tokens must lie in 1..{most}, the engine's γ "
                                 "(the draft proposes that many; a request may verify fewer).",
                                 "num_speculative_tokens")
        vocab = self.engine.vocab_size
        if options.top_k is not None and not 0 <= options.top_k <= vocab:
            raise InvalidOptions(f"top_k must lie in 0..{vocab} (this model's vocabulary; 0 = off).", "top_k")
        if options.max_tokens is not None and options.max_tokens < self.min_max_tokens:
            raise InvalidOptions(f"max_tokens must be at least {self.min_max_tokens}: with fewer tokens per "
                                 "sentence this model makes no audio.", "max_tokens")
        if options.asg_table is not None and options.asg_table not in self.asg_table_names:
            raise InvalidOptions(f"ASG table {options.asg_table!r} is not loaded; choose one of "
                                 f"{self.asg_table_names} (load more with --extra-asg-tables).", "asg_table")

    def sampling_params(self, options: SynthesisOptions, prompt, index: int = 0):
        from pcgtts.engine.config import SamplingParams

        defaults = self.default_sampling
        rule = options.acceptance
        gamma = options.num_speculative_tokens
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
            asg_table=None if options.asg_table == self.asg_table_name else options.asg_table,
            num_speculative_tokens=None if gamma in (None, self.engine_num_speculative_tokens) else gamma,
        )

    def sentence_segments(self, sentence: str) -> list[str]:
        """One sentence -> the pieces synthesised one after another (the family's splitter if it has one,
        else only sentences over `sentence_max_chars` are cut)."""
        own = self.family.split_sentence(sentence)
        pieces = own if own is not None else split_long(sentence, self.config.sentence_max_chars)
        return [p for p in pieces if p.strip()]

    def segments(self, text: str) -> list[str]:
        """Input text -> the pieces synthesised one after another: its sentences (`tts/text.py`), each cut
        by `sentence_segments`; for a family without a splitter of its own, short sentences are also
        merged ("Hi. Yes." is one piece)."""
        sentences = sentences_of(text)
        if sentences and self.family.split_sentence(sentences[0]) is None:
            return split_sentences(text, self.config.sentence_max_chars)
        return [p for sentence in sentences for p in self.sentence_segments(sentence)]

    def text_feed(self, max_pending_chars: int | None = None, max_pending_s: float | None = None) -> TextFeed:
        """For text that is still arriving: push it into the feed and `synthesize` the feed, which speaks
        each sentence once it is complete (the bounds speak a long clause before its end; None: no
        bound). Call on the event loop that iterates the synthesis."""
        return TextFeed(self.sentence_segments, max_pending_chars, max_pending_s)

    def synthesize(self, text: str | TextFeed, voice: VoicePrompt | ReferenceClip | None,
                   options: SynthesisOptions | None = None) -> Synthesis:
        """The one call per request: text in the voice (None = the model's default; a ReferenceClip is
        encoded when the synthesis starts) -> a Synthesis streaming audio at `Synthesis.sample_rate`.
        Nothing runs until iterated. Raises InvalidOptions, or NothingToSay for text without words, at
        once; NothingToSay can also come from the first iteration when no segment has speakable sounds
        (for a TextFeed, only then: its text is not known yet)."""
        options = options or SynthesisOptions()
        self.validate(options)
        segments = text if isinstance(text, TextFeed) else self.segments(text)
        if not segments:
            raise NothingToSay("the input holds nothing this model can speak")
        return Synthesis(self._synthesis_context(), segments, voice, replace(options))

    def _synthesis_context(self) -> SynthesisContext:
        """What a synthesis uses of this service (read when it starts: the current decode pool)."""
        return SynthesisContext(
            sample_rate=self.sample_rate, frame_rate=self.codec.frame_rate,
            sentence_pause_s=self.config.sentence_pause_s, build_prompt=self.family.build_prompt,
            tokens_to_codes=self.family.tokens_to_codes, sampling_params=self.sampling_params,
            streaming_decoder=self.decoder.streaming_decoder, decode=self.decoder.push,
            stream=self.engine.stream, set_deadline=self.engine.set_deadline,
            encode_voice=self.encode_voice, pin_voice=self.pin_voice,
            first_audio_max_hold_s=self.config.first_audio_max_hold_s)

    # -- monitoring and shutdown
    @property
    def fault(self) -> str | None:
        """Why the engine failed every request and takes no more (device lost, out of memory), if it did."""
        return self.engine.fault

    def engine_stats(self) -> EngineMetrics:
        """The engine's snapshot (gauges and cumulative counters) as published after its latest step."""
        return self.engine.metrics()

    def codec_stats(self) -> CodecStats:
        return self.decoder.snapshot()

    def close(self) -> None:
        self.decoder.close()
        self.engine.shutdown()
