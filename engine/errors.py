"""Errors the engine raises to its callers."""


class EngineError(RuntimeError):
    """Base class of engine errors."""


class EngineOverloaded(EngineError):
    """The bounded waiting queue is full; the caller should retry later (HTTP 503/429)."""


class RequestTooLong(EngineError, ValueError):
    """The prompt (plus room for one speculative step) does not fit the model length or KV capacity."""


class EngineShutdown(EngineError):
    """The engine was shut down while the request was pending."""


class EngineFault(EngineError):
    """A fault that is no single request's (device lost, out of memory): every request in flight failed and
    the engine takes no new ones."""


class RequestFailed(EngineError):
    """This request alone failed inside an engine step (the others in the batch went on)."""
