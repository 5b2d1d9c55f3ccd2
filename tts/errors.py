"""The TTS service's exceptions: what a caller (the server, the CLI) maps to its own error shape."""

from __future__ import annotations


class InvalidOptions(ValueError):
    """A synthesis option the served engine cannot honour; `param` names the request field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


class NothingToSay(ValueError):
    """The input holds nothing the model can speak (e.g. only punctuation)."""


class ServiceOverloaded(RuntimeError):
    """The engine's waiting queue is full; retry later."""


class InputTooLong(ValueError):
    """A sentence's prompt does not fit the model length or KV capacity."""


class ServiceUnavailable(RuntimeError):
    """The engine has shut down, or failed with a fault that is no request's (device lost, out of memory)."""


class SynthesisFailed(RuntimeError):
    """This request failed inside the engine (its own fault; the other requests went on)."""
