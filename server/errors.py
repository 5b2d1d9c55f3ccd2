"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with a fitting HTTP status.

Route code raises `APIError` (or one of the helpers); the handlers installed by `install_error_handlers`
turn it, pydantic validation failures and unexpected exceptions into that shape, so that the official
`openai` client raises its matching exception class (BadRequestError, NotFoundError, RateLimitError, ...).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pcgtts.server.drain import StreamCut
from pcgtts.tts import EncoderUnavailable
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

log = logging.getLogger("pcgtts.server")

# HTTP status -> OpenAI error `type`.
_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}

# pydantic error type -> OpenAI-style `code` (the ones a client is likely to branch on).
_CODE_BY_PYDANTIC_TYPE = {
    "missing": "missing_required_parameter",
    "extra_forbidden": "unknown_parameter",
    "string_too_long": "string_above_max_length",
    "string_too_short": "string_below_min_length",
    "literal_error": "invalid_value",
    "enum": "invalid_value",
    "greater_than_equal": "decimal_below_min_value",
    "greater_than": "decimal_below_min_value",
    "less_than_equal": "decimal_above_max_value",
    "less_than": "decimal_above_max_value",
    "json_invalid": "invalid_json",
    "finite_number": "invalid_value",
}


class APIError(Exception):
    """An error the client caused or should know about; rendered in OpenAI's shape."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPE_BY_STATUS.get(status, "server_error")
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, *, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def not_found(message: str, *, param: str | None = None, code: str = "not_found") -> APIError:
    return APIError(404, message, param=param, code=code)


def not_ready() -> APIError:
    return APIError(503, "The model is still loading; retry shortly (GET /ready turns 200 when it is up).",
                    code="model_not_ready", headers={"Retry-After": "2"})


def _param_of(loc: tuple) -> str | None:
    """('voice', 'VoiceId', 'id') -> 'voice.id'; drops pydantic's union-branch names like 'str'."""
    parts = [str(p) for p in loc if not (isinstance(p, str) and (p[:1].isupper() or "[" in p))]
    parts = [p for p in parts if p not in ("str", "int", "float", "bool")]
    return ".".join(parts) or None


_RANGE_ERRORS = {"greater_than_equal", "greater_than", "less_than_equal", "less_than", "finite_number",
                 "int_from_float", "int_parsing", "float_parsing", "int_type", "float_type"}


def field_range(model: type[BaseModel] | None, param: str | None) -> str | None:
    """'a finite number between 0.25 and 4.0' for a top-level numeric field of `model` with bounds (the
    model's own `range_rules` text where it has one), else None."""
    info = model.model_fields.get(param or "") if model is not None else None
    if info is None:
        return None
    if (rule := getattr(model, "range_rules", {}).get(param)) is not None:
        return rule
    lo = hi = None
    for bound in info.metadata:
        lo = getattr(bound, "ge", getattr(bound, "gt", lo))
        hi = getattr(bound, "le", getattr(bound, "lt", hi))
    if lo is None or hi is None:
        return None
    gt = any(hasattr(b, "gt") for b in info.metadata)
    lt = any(hasattr(b, "lt") for b in info.metadata)
    low, high = f"{lo} (exclusive)" if gt else f"{lo}", f"{hi} (exclusive)" if lt else f"{hi}"
    return f"a finite number between {low} and {high}"


def validation_error(errors: list[dict], *, in_body: bool = True,
                     model: type[BaseModel] | None = None) -> APIError:
    """pydantic errors -> a 400 naming the first bad field (and its range, for a number of `model`).
    in_body: locations start with 'body'."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": "value_error"}
    loc = tuple(first.get("loc", ()))
    param = _param_of(loc[1:] if in_body else loc)
    msg = first.get("msg", "invalid request")
    ruled = first.get("type") in _RANGE_ERRORS or first.get("type") == "value_error" and \
        param in getattr(model, "range_rules", {})
    allowed = field_range(model, param) if ruled else None
    if allowed is not None:
        got = first.get("input")
        msg = f"Invalid value for '{param}': must be {allowed}" + \
              (f"; got {got!r}." if isinstance(got, int | float | str) and len(repr(got)) < 64 else ".")
    elif first.get("type") == "extra_forbidden":
        msg = f"Unrecognized request argument supplied: {param}"
    elif first.get("type") == "json_invalid":
        msg = "We could not parse the JSON body of your request."
        param = None
    elif param:
        msg = f"Invalid value for '{param}': {msg}"
    if first.get("type") == "finite_number":
        msg = msg.replace("finite number", "finite number (not NaN or infinity)")
    code = _CODE_BY_PYDANTIC_TYPE.get(first.get("type"), "invalid_value")
    return APIError(400, msg, param=param, code=code)


def allowed_methods(request: Request) -> str:
    """Every method some route serves at this path (Starlette names only the first route's), plus OPTIONS."""
    methods = {"OPTIONS"}
    for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"):
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] is Match.FULL for route in request.app.router.routes):
            methods.add(method)
    return ", ".join(sorted(methods))


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        from pcgtts.server.schemas import SpeechRequest  # the one JSON body model

        err = validation_error(exc.errors(), model=SpeechRequest)
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        status = exc.status_code
        if status == 405:
            allow = allowed_methods(request)
            if request.method == "OPTIONS":  # what the resource supports, not an error
                return Response(status_code=204, headers={"Allow": allow})
            body = error_body(f"Method {request.method} not allowed on {request.url.path}; allowed: {allow}.",
                              "invalid_request_error", None, "method_not_allowed")
            return JSONResponse(body, status_code=405, headers={"Allow": allow})
        body = error_body(str(exc.detail), _TYPE_BY_STATUS.get(status, "server_error"), None,
                          {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(status))
        return JSONResponse(body, status_code=status, headers=getattr(exc, "headers", None))

    @app.exception_handler(EncoderUnavailable)
    async def _no_encoder(_: Request, exc: EncoderUnavailable) -> JSONResponse:
        # A decode-only codec (X-codec2 without its semantic model): the server's setup, not the request.
        body = error_body(f"This server cannot encode voice clips: {exc}", "server_error", None,
                          "voice_encoding_unavailable")
        return JSONResponse(body, status_code=501)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        if not isinstance(exc, StreamCut):  # a cut on purpose is logged where it is made
            log.exception("unhandled error")
        return JSONResponse(error_body(f"Internal server error: {type(exc).__name__}", "server_error", None,
                                       "internal_error"), status_code=500)
