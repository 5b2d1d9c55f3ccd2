"""The FastAPI application: `create_app(settings)` wires routes, errors, auth and the model's lifecycle."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from server.errors import APIError, install_error_handlers
from server.routes import playground, speech, system, voices, ws
from server.settings import ServerSettings
from server.state import AppState
from tts import TTSService

API_DESCRIPTION = """
OpenAI-compatible text-to-speech with speculative decoding (PCG acceptance).

* `POST /v1/audio/speech` streams audio (mp3, opus, aac, flac, wav, pcm; 24 kHz mono) or SSE events,
  with extensions for an inline speaker prompt (`ref_audio` + `ref_text`), sampling and the acceptance rule.
* `/v1/audio/voices` uploads, lists and deletes cloned voices (persisted across restarts).
* `WS /v1/audio/speech/stream` streams PCM for live playback (protocol below).
* `/metrics` exports Prometheus metrics; `/health` and `/ready` are for probes; `/` is a playground.

Errors have OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
"""


def _body_limit(settings: ServerSettings) -> int:
    # An upload, or the same audio base64-encoded inside JSON, plus room for the other fields.
    return settings.max_upload_bytes * 4 // 3 + (1 << 20)


class GuardMiddleware:
    """Plain ASGI (so streaming and disconnects pass untouched): rejects oversized bodies by their
    Content-Length and, when an API key is set, /v1/* HTTP requests without it (the WebSocket route
    checks its own)."""

    def __init__(self, app: ASGIApp, body_limit: int, api_key: str | None):
        self.app = app
        self.body_limit = body_limit
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            length = headers.get("content-length", "")
            err = None
            if length.isdigit() and int(length) > self.body_limit:
                err = APIError(413, f"Request body over {self.body_limit} bytes.", code="request_too_large")
            elif self.api_key and scope["path"].startswith("/v1/") and \
                    headers.get("authorization", "") != f"Bearer {self.api_key}":
                err = APIError(401, "Incorrect API key provided.", code="invalid_api_key")
            if err is not None:
                await JSONResponse(err.body(), status_code=err.status)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(settings: ServerSettings | None = None, service: TTSService | None = None) -> FastAPI:
    """settings: server options (defaults: the embedded model). service: an already loaded TTS service
    (the app then does not close it); None loads one in the background at start-up."""
    settings = settings or ServerSettings()
    state = AppState(settings, service)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        state.start_loading()
        try:
            yield
        finally:
            state.close()

    app = FastAPI(title="pcgtts", version="0.1.0", lifespan=lifespan,
                  description=API_DESCRIPTION + "\n### WebSocket protocol\n\n" + ws.PROTOCOL)
    app.state.pcgtts = state
    install_error_handlers(app)

    app.add_middleware(GuardMiddleware, body_limit=_body_limit(settings), api_key=settings.api_key)
    if settings.cors_origins:
        origins = [o.strip() for o in settings.cors_origins.split(",")]
        app.add_middleware(CORSMiddleware, allow_origins=origins,
                           allow_methods=["*"], allow_headers=["*"])
    for module in (speech, voices, ws, system, playground):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=playground.STATIC_DIR), name="static")
    return app
