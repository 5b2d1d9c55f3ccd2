"""The WebSocket protocol of `/v1/audio/speech/stream` as code: one pydantic model per message.

This module is the protocol's one source. The server builds every JSON event it sends from these models,
`protocol_markdown()` renders the description that /docs and the README show, and the tests validate what
a real server sends against `parse_server_event`.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pcgtts.server.schemas import ErrorDetail
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

MAX_QUEUED = 8  # utterances waiting behind the running one, per connection
EMPTY_INPUT_DONE = "input.done with no text pending: send input.text first."


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    omitted_when_none: ClassVar[frozenset[str]] = frozenset()  # optional fields left out rather than null


# ----------------------------------------------------------------------------------- client -> server
class InputText(Message):
    """Appends text to the pending utterance; in sentence mode each sentence it completes is spoken now."""

    type: Literal["input.text"] = "input.text"
    text: str


class InputDone(Message):
    type: Literal["input.done"] = "input.done"


InputDone.__doc__ = (f"Speaks the pending text (queued behind a running utterance; at most {MAX_QUEUED} "
                     "waiting per connection, more get an error); in sentence mode, the rest of the "
                     "utterance's text (it was queued at its first words). With no text pending (none sent, "
                     "or only whitespace, since the last input.done) it answers an `error` event, code "
                     "`empty_input`.")


class InputCancel(Message):
    """Barge-in: aborts the running utterance at once (it ends with a `cancelled` audio.done; the engine
    stops its work within one step) and drops queued ones, in sentence mode also the text still arriving
    and its sentences not yet spoken."""

    type: Literal["input.cancel"] = "input.cancel"


class SessionClose(Message):
    """Finishes the queued utterances (in sentence mode the text that has arrived is spoken to its end), then
    answers `session.done` and closes the socket."""

    type: Literal["session.close"] = "session.close"


# ----------------------------------------------------------------------------------- server -> client
class SessionCreated(Message):
    """Sent once, when the socket opens."""

    type: Literal["session.created"] = "session.created"
    format: Literal["pcm"] = "pcm"
    sample_rate: int = Field(description="of the binary frames until a session.config changes it")
    model: str


class AudioStart(Message):
    """An utterance starts; its binary frames follow: 16-bit little-endian mono PCM at `sample_rate`."""

    type: Literal["audio.start"] = "audio.start"
    utterance_id: int
    format: Literal["pcm"] = "pcm"
    sample_rate: int
    channels: Literal[1] = 1


class ChunkAcceptance(BaseModel):
    """What speculation did for the audio of one chunk: the engine steps since the previous event."""

    model_config = ConfigDict(extra="forbid")
    tokens: int = Field(description="speech tokens emitted")
    steps: int = Field(description="engine steps, i.e. verify steps when speculating")
    drafted: int = Field(description="draft tokens proposed")
    accepted: int = Field(description="of which the target accepted")


class Acceptance(Message):
    """The utterance's counters so far (cumulative)."""

    utterance_id: int
    samples: int = Field(description="PCM samples sent")
    tokens: int = Field(description="speech tokens generated")
    steps: int = Field(description="engine steps that emitted them")
    drafted: int
    accepted: int
    acceptance_rate: float | None = Field(description="accepted / drafted; null without a draft")
    mean_accepted_len: float | None = Field(description="tokens per engine step (1 target-only, up to γ+1)")


class AudioProgress(Acceptance):
    """After each binary frame: the live acceptance trace (`chunk`) and the running totals."""

    type: Literal["audio.progress"] = "audio.progress"
    chunk: ChunkAcceptance


class AlignedWord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str
    start: int
    end: int


class AudioAlignment(Message):
    """With `word_timings` in the session's config, where the model's family knows its alignment
    (`pcgtts.word_timings` in GET /v1/models; none otherwise, never a guess): after a binary frame, the words
    whose start the audio sent so far has reached, each once, in order (the rest after the last frame)."""

    type: Literal["audio.alignment"] = "audio.alignment"
    utterance_id: int
    words: list[AlignedWord] = Field(description='`[{"text", "start", "end"}]`: the word as written, its '
                                                 "first sample and its end (exclusive), counted in the "
                                                 "utterance's binary frames from its first sample")


class Usage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input_tokens: int
    output_tokens: int
    total_tokens: int


class AudioDone(Acceptance):
    """The utterance ended: finished, failed (an error event came first) or cancelled; the same fields
    every time."""

    type: Literal["audio.done"] = "audio.done"
    total_bytes: int = Field(description="PCM bytes sent for the utterance")
    audio_seconds: float
    ttfa_ms: float | None = Field(description="request to first audio; null when none was sent")
    omitted_when_none: ClassVar[frozenset[str]] = frozenset({"reason"})
    usage: Usage = Field(description='`{"input_tokens", "output_tokens", "total_tokens"}`')
    finish_reason: str | None = Field(description="stop | length | abort | error")
    cancelled: bool = Field(description="true after input.cancel, or when the server's drain cut it")
    reason: str | None = Field(None, description='"server_shutdown" when the drain cut it; absent otherwise')


class ErrorEvent(Message):
    """A bad message or a failed utterance, in OpenAI's error shape; the session goes on."""

    omitted_when_none: ClassVar[frozenset[str]] = frozenset({"utterance_id"})
    type: Literal["error"] = "error"
    utterance_id: int | None = Field(None, description="absent for errors about a message")
    error: ErrorDetail = Field(description='`{"message", "type", "param", "code"}`')


class SessionDone(Message):
    """The answer to session.close, after the last queued utterance's audio.done; then the socket closes."""

    omitted_when_none: ClassVar[frozenset[str]] = frozenset({"reason"})
    type: Literal["session.done"] = "session.done"
    reason: str | None = Field(None, description='"server_shutdown" when the server drains for shutdown: it '
                                                 "finishes queued utterances within its drain deadline, cuts "
                                                 "what is left (audio.done cancelled, same reason), then "
                                                 "closes with 1001; absent otherwise")


CLIENT_MESSAGES: tuple[type[BaseModel], ...] = (InputText, InputDone, InputCancel, SessionClose)
SERVER_EVENTS: tuple[type[Message], ...] = (SessionCreated, AudioStart, AudioProgress, AudioAlignment,
                                            AudioDone, ErrorEvent, SessionDone)
_SERVER_EVENT = TypeAdapter(Annotated[SessionCreated | AudioStart | AudioProgress | AudioAlignment | AudioDone
                                      | ErrorEvent | SessionDone, Field(discriminator="type")])


def parse_server_event(payload: dict) -> Message:
    """A JSON event as the server sent it -> its model; raises pydantic.ValidationError if off-protocol."""
    return _SERVER_EVENT.validate_python(payload)


def event_json(event: Message) -> dict:
    """The wire form of an event (its optional fields that are None are left out, not null)."""
    payload = event.model_dump(mode="json")
    for name in event.omitted_when_none:
        if payload.get(name, 0) is None:
            del payload[name]
    return payload


# ------------------------------------------------------------------------------------------ the doc
def _type_of(model: type[BaseModel]) -> str:
    return model.model_fields["type"].default


def _message_line(model: type[BaseModel]) -> str:
    fields = [f'"{name}"' + ("?" if name in model.omitted_when_none else "")
              for name in model.model_fields if name != "type"]
    head = ", ".join([f'"type": "{_type_of(model)}"', *fields])
    doc = " ".join((model.__doc__ or "").split())
    return f"* `{{{head}}}`: {doc}"


def _field_notes(model: type[BaseModel]) -> list[str]:
    """Notes on the fields the model itself declares (inherited ones are described where declared)."""
    own = model.__annotations__
    return [f"  * `{name}`: {info.description}" for name, info in model.model_fields.items()
            if info.description and name in own]


def protocol_markdown(session_config: type[BaseModel], handshake: str) -> str:
    """The protocol as Markdown, generated from the models (session_config: the server's config message,
    whose fields are the speech request's; handshake: what the route checks before accepting)."""
    config_fields = ", ".join(f"`{name}`" for name in session_config.model_fields if name != "type")
    lines = [
        f"`WS /v1/audio/speech/stream`. {handshake}",
        "",
        "Client -> server, JSON text messages:",
        f'* `{{"type": "session.config", ...}}`: {" ".join((session_config.__doc__ or "").split())} '
        f"Fields: {config_fields}.",
        *_field_notes(session_config),
    ]
    lines += [_message_line(m) for m in CLIENT_MESSAGES]
    lines += ["", "Server -> client, JSON text messages and binary audio frames:"]
    for model in SERVER_EVENTS:
        lines.append(_message_line(model))
        lines += _field_notes(model)
        if model is AudioProgress:  # the counters it shares with audio.done are described here
            lines += _field_notes(Acceptance)
            parts = ", ".join(f"`{n}` ({i.description})" for n, i in ChunkAcceptance.model_fields.items())
            lines.append(f"  * `chunk`: {' '.join((ChunkAcceptance.__doc__ or '').split())} {parts}")
    lines += ["", "Closing the socket aborts the running utterance at once and frees its KV cache."]
    return "\n".join(lines) + "\n"
