"""The FastAPI application: `create_app(settings)` wires routes, errors, auth and the model's lifecycle."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from pcgtts.server.drain import Drain, quiet_expected_cuts
from pcgtts.server.errors import APIError, install_error_handlers
from pcgtts.server.limits import publish_limits, request_limits
from pcgtts.server.routes import playground, speech, system, voices, ws
from pcgtts.server.security import http_authorized, protect_key_in_logs
from pcgtts.server.settings import ServerSettings
from pcgtts.server.state import AppState
from pcgtts.tts import TTSService
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

API_DESCRIPTION = """
OpenAI-compatible text-to-speech with speculative decoding (PCG acceptance).

* `POST /v1/audio/speech` streams audio (mp3, opus, aac, flac, wav, pcm; 24 kHz mono) or SSE events,
  with extensions for an inline speaker prompt (`ref_audio` + `ref_text`), sampling and the acceptance rule;
  flac and wav come as complete files (lengths in their headers) unless the client asks for a stream
  (`"stream": true`, SSE, or the openai SDK's `with_streaming_response`).
* `/v1/audio/voices` uploads, lists and deletes cloned voices (persisted across restarts).
* `WS /v1/audio/speech/stream` streams PCM for live playback (protocol below).
* `/metrics` exports Prometheus metrics; `/health` and `/ready` are for probes; `/` is a playground.

Errors have OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
"""


def _body_limit(settings: ServerSettings) -> int:
    # An upload, or the same audio base64-encoded inside JSON, plus room for the other fields.
    return settings.max_upload_bytes * 4 // 3 + (1 << 20)


class BodyTooLarge(StarletteHTTPException):
    """Raised from `receive` once a body passes the limit; FastAPI's body parsing lets HTTP errors through."""

    def __init__(self, limit: int):
        super().__init__(413, f"Request body over {limit} bytes.")


def _refusal(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


class GuardMiddleware:
    """Plain ASGI (so streaming and disconnects pass untouched), for every HTTP request:
    * body size: refused by Content-Length when declared, else counted as the bytes arrive and stopped at
      the limit (chunked JSON and multipart alike), so nothing past it is read, parsed or spooled;
    * the API key on /v1/* (constant-time compare; the WebSocket route checks its own);
    * the drain: once shutting down, new /v1/* POSTs get 503; requests in flight are tracked until their
      response has been sent."""

    def __init__(self, app: ASGIApp, body_limit: int, api_key: str | None, drain: Drain):
        self.app = app
        self.body_limit = body_limit
        self.api_key = api_key
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        length = headers.get("content-length", "")
        api = scope["path"].startswith("/v1/")
        if length.isdigit() and int(length) > self.body_limit:
            err = APIError(413, f"Request body over {self.body_limit} bytes.", code="request_too_large")
            await _refusal(err)(scope, receive, send)
            return
        if api and not http_authorized(headers, self.api_key):
            err = APIError(401, "Incorrect API key provided.", code="invalid_api_key")
            await _refusal(err)(scope, receive, send)
            return
        if api and self.drain.draining and scope["method"] == "POST":
            err = APIError(503, "The server is shutting down; retry on another replica.",
                           code="server_shutting_down", headers={"Retry-After": "1"})
            await _refusal(err)(scope, receive, send)
            return

        received = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.body_limit:
                    raise BodyTooLarge(self.body_limit)
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        with self.drain.track():
            try:
                await self.app(scope, counted_receive, watched_send)
            except BodyTooLarge:
                if started:
                    raise
                err = APIError(413, f"Request body over {self.body_limit} bytes.", code="request_too_large")
                await _refusal(err)(scope, receive, send)


def create_app(settings: ServerSettings | None = None, service: TTSService | None = None) -> FastAPI:
    """settings: server options (defaults: the embedded model). service: an already loaded TTS service
    (the app then does not close it); None loads one in the background at start-up."""
    settings = settings or ServerSettings()
    state = AppState(settings, service)

    protect_key_in_logs(settings.api_key)  # every logger's records, from here on

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        quiet_expected_cuts()  # after uvicorn has configured its loggers
        state.start_loading()
        try:
            yield
        finally:
            state.close()

    # /docs and /redoc serve Swagger UI and ReDoc from the fastapi-offline wheel, not a CDN (air-gapped docs).
    app = FastAPIOffline(title="pcgtts", version="0.1.0", lifespan=lifespan,
                         description=API_DESCRIPTION + "\n### WebSocket protocol\n\n" + ws.PROTOCOL)
    app.state.pcgtts = state
    install_error_handlers(app)

    app.add_middleware(GuardMiddleware, body_limit=_body_limit(settings), api_key=settings.api_key,
                       drain=state.drain)
    if settings.allowed_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.allowed_origins,
                           allow_methods=["*"], allow_headers=["*"])
    for module in (speech, voices, ws, system, playground):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=playground.STATIC_DIR), name="static")
    install_published_limits(app, state)
    return app


def install_published_limits(app: FastAPI, state: AppState) -> None:
    """/openapi.json with the request limits of the model being served (server/limits.py), built once before
    the model has loaded (the general bounds) and once after (its own)."""
    built = app.openapi  # FastAPI's generator, which caches its result
    published: dict[bool, dict] = {}

    def openapi() -> dict:
        loaded = state.service is not None
        if loaded not in published:
            capabilities = state.service.capabilities() if loaded else None
            published[loaded] = publish_limits(built(), request_limits(capabilities))
        return published[loaded]

    app.openapi = openapi
