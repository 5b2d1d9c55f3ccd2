"""Request and response bodies of the HTTP API (pydantic), OpenAI's fields first, then our extensions."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pcgtts.server.audio.formats import ResponseFormat
from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_INPUT_CHARS = 4096
MAX_TOP_K = 1_000_000  # above any vocabulary served here; the service refuses more than its own vocabulary
MAX_TOKENS = 65536
MIN_TEMPERATURE = 0.01  # between 0 (greedy) and this: refused, not rounded
MAX_TEMPERATURE = 2.0
# The one statement of the temperature rule: errors, the schema's description and the README say it alike.
TEMPERATURE_RULE = f"0 (greedy) or a finite number between {MIN_TEMPERATURE:g} and {MAX_TEMPERATURE:g}"


def integral(value: Any) -> Any:
    """An integer as JSON Schema (and so /openapi.json) means it: a JSON number whose fraction is zero, so
    3.0 is taken as 3; true/false and "3" still fail the strict int check that follows."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


class VoiceId(BaseModel):
    """OpenAI's custom-voice form `{"id": "voice_..."}`; a preset name is accepted too."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=128)


class SamplingFields(BaseModel):
    """Extensions shared by the HTTP body and the WebSocket session config. None = server default.

    Every number has a closed range (finite, never clamped): a value outside gets a 400 that names it."""

    model_config = ConfigDict(allow_inf_nan=False)
    # what a range error says for fields whose allowed values are not one interval
    range_rules: ClassVar[dict[str, str]] = {"temperature": TEMPERATURE_RULE}

    # strict: a number must be a JSON number (no true/false, no "3"); ranges are closed and never clamped
    temperature: float | None = Field(None, strict=True, ge=0.0, le=MAX_TEMPERATURE,
                                      description=f"Sampling temperature: {TEMPERATURE_RULE}.")
    top_p: float | None = Field(None, strict=True, ge=0.01, le=1.0,
                                description="Nucleus sampling mass, 0.01..1.")
    top_k: int | None = Field(None, strict=True, ge=0, le=MAX_TOP_K,
                              description="Keep the k most likely tokens; 0 = off; at most the vocabulary.")
    repetition_penalty: float | None = Field(None, strict=True, ge=0.1, le=3.0,
                                             description="1 = off; 0.1..3.")
    seed: int | None = Field(None, strict=True, ge=0, le=2**63 - 1,
                             description="Seed for reproducible sampling.")
    max_tokens: int | None = Field(None, strict=True, ge=1, le=MAX_TOKENS,
                                   description="Cap on generated speech tokens per sentence.")
    acceptance: str | None = Field(
        None, description="Speculative acceptance rule for this request (A/B tests): one the server "
                          "lists in GET /v1/models under `pcgtts.acceptance_rules`.")
    num_speculative_tokens: int | None = Field(
        None, ge=1, le=16, strict=True,
        description="Draft tokens verified per step for this request: 1 up to the engine's γ "
                    "(`pcgtts.num_speculative_tokens` in GET /v1/models).")
    asg_table: str | None = Field(
        None, description="Name of a loaded ASG table (θ choice) for PCG/LANTERN: one of "
                          "`pcgtts.asg_tables` in GET /v1/models.")
    ref_audio: str | None = Field(
        None, description="Inline speaker prompt: reference audio as base64 or a `data:audio/...;base64,` "
                          "URL (WAV/FLAC/MP3/OGG). Overrides `voice`.")
    ref_text: str | None = Field(None, max_length=2000, description="Transcript of `ref_audio`.")

    _integral = field_validator("top_k", "seed", "max_tokens", "num_speculative_tokens",
                                mode="before")(integral)

    @field_validator("temperature")
    @classmethod
    def _greedy_or_warm(cls, value: float | None) -> float | None:
        if value is not None and 0 < value < MIN_TEMPERATURE:
            raise ValueError(f"must be {TEMPERATURE_RULE}")
        return value


# Word timings travel as SSE events only: the schema says so (JSON Schema's if/then), so a client or a fuzzer
# reading it knows that word_timings without stream_format "sse" is refused.
_TIMINGS_NEED_SSE = {
    "if": {"properties": {"word_timings": {"const": True}}, "required": ["word_timings"]},
    "then": {"properties": {"stream_format": {"const": "sse"}}, "required": ["stream_format"]},
}


class SpeechRequest(SamplingFields):
    """Body of POST /v1/audio/speech."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, json_schema_extra=_TIMINGS_NEED_SSE)

    model: str = Field("pcgtts", max_length=256, description="Any model name; all map to the served model.")
    input: str = Field(min_length=1, max_length=MAX_INPUT_CHARS, description="Text to speak.")
    voice: str | VoiceId | None = Field(
        None, description="A voice name (preset, uploaded, or an OpenAI built-in name mapped to a preset) "
                          "or {\"id\": ...} of an uploaded voice. Default: the model's first preset.")
    instructions: str | None = Field(
        None, max_length=MAX_INPUT_CHARS, description="Accepted for compatibility; this model ignores it.")
    response_format: ResponseFormat = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0, strict=True, description="Playback speed, pitch preserved.")
    stream_format: Literal["audio", "sse"] = "audio"
    word_timings: bool = Field(
        False, strict=True,
        description="With stream_format 'sse': `speech.audio.alignment` events say when each word is heard "
                    "(`words`: text, start and end sample at `sample_rate`), where the model's family knows "
                    "its alignment (`pcgtts.word_timings` in GET /v1/models); otherwise none are sent.")
    stream: bool | None = Field(
        None, strict=True,
        description="Extension. true: stream (bytes leave as they are made); false: wait for the whole "
                    "utterance and send it with Content-Length and complete headers. Unset: streamed, "
                    "except `flac` and `wav`, whose headers hold the length: those come as complete files "
                    "unless the client streams (`stream_format: \"sse\"`, or the openai SDK's "
                    "`with_streaming_response`).")


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int


class VoiceResource(BaseModel):
    """One voice in GET /v1/audio/voices; OpenAI's `audio.voice` object plus a few fields."""

    object: Literal["audio.voice"] = "audio.voice"
    id: str
    name: str
    created_at: int
    type: Literal["audio_sample", "preset"] = Field(description="OpenAI's field: how the voice was made.")
    kind: Literal["preset", "uploaded"]
    transcript: str | None = None
    duration: float | None = None


class VoiceList(BaseModel):
    """Parsed by OpenAI-list clients (`data`) and Kokoro-style clients (`voices`, a list of names)."""

    object: Literal["list"] = "list"
    data: list[VoiceResource]
    voices: list[str]


class VoiceDeleted(BaseModel):
    id: str
    object: Literal["audio.voice.deleted"] = "audio.voice.deleted"
    deleted: bool = True


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "pcgtts"
    pcgtts: dict | None = Field(None, description="Serving details: sample rate, rules, ASG table.")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail
