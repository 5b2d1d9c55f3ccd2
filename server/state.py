"""What the routes share: settings, the TTS service once loaded, the voice store, metrics."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

from fastapi import Request, WebSocket
from pcgtts.server.drain import Drain
from pcgtts.server.errors import APIError, not_ready
from pcgtts.server.metrics import ServerMetrics
from pcgtts.server.settings import ServerSettings
from pcgtts.server.voice_store import VoiceStore
from pcgtts.server.voices import VoiceLimits, VoiceResolver
from pcgtts.tts import TTSConfig, TTSService

log = logging.getLogger("pcgtts.server")


def tts_config(settings: ServerSettings) -> TTSConfig:
    """The service's config: every option the two share by name, plus the renamed ones."""
    shared = {f.name for f in fields(TTSConfig)} & {f.name for f in fields(ServerSettings)}
    shared -= {"extra_asg_tables", "speculation_lengths"}  # strings of items in the settings
    return TTSConfig(
        **{name: getattr(settings, name) for name in shared},
        model_dir=settings.model or TTSConfig.model_dir, codec_dir=settings.codec, draft_dir=settings.draft,
        extra_asg_tables=settings.extra_asg_table_paths,
        speculation_lengths=settings.speculation_length_values,
        compile_cache_dir=Path(settings.data_dir) / "inductor")


class AppState:
    def __init__(self, settings: ServerSettings, service: TTSService | None = None):
        self.settings = settings
        self.started_at = int(time.time())
        self.model_name = Path(settings.model).name if settings.model else Path(TTSConfig().model_dir).name
        self.store = VoiceStore(settings.voices_dir, shared=settings.shared_voices)
        self.limits = VoiceLimits(settings.max_upload_bytes, settings.min_voice_seconds,
                                  settings.max_voice_seconds)
        self.metrics = ServerMetrics(self.model_name, self._engine_stats, self._codec_stats)
        self.service: TTSService | None = None
        self.resolver: VoiceResolver | None = None
        self.load_error: str | None = None
        self.drain = Drain(settings.drain_timeout_s)
        self._owns_service = service is None
        self._loader: threading.Thread | None = None
        self._on_loaded: list[Callable[[], None]] = []
        self._loaded_lock = threading.Lock()
        if service is not None:
            self._attach(service)

    def _attach(self, service: TTSService) -> None:
        self.resolver = VoiceResolver(service, self.store, self.limits)
        with self._loaded_lock:
            self.service = service  # /ready answers 200 from here on
            callbacks, self._on_loaded = self._on_loaded, []
        for callback in callbacks:
            callback()

    def when_loaded(self, callback: Callable[[], None]) -> None:
        """Calls `callback` once the model is loaded (at once if it is; else on the loading thread)."""
        with self._loaded_lock:
            if self.service is None:
                self._on_loaded.append(callback)
                return
        callback()

    def _engine_stats(self):
        return self.service.engine_stats() if self.service is not None else None

    def _codec_stats(self):
        return self.service.codec_stats() if self.service is not None else None

    def start_loading(self) -> None:
        """Loads the model in a thread so /health answers (and /ready says 503) meanwhile."""
        if self.service is not None:
            return

        def load() -> None:
            try:
                started = time.perf_counter()
                service = TTSService.load(tts_config(self.settings))
                log.info("model %s loaded in %.1f s (%d preset voices)", service.model_id,
                         time.perf_counter() - started, len(service.preset_voices()))
                self._attach(service)
            except Exception as exc:  # reported by /ready
                log.exception("model failed to load")
                self.load_error = f"{type(exc).__name__}: {exc}"

        self._loader = threading.Thread(target=load, name="pcgtts-load", daemon=True)
        self._loader.start()

    async def wait_loaded(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.service is None and self.load_error is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.service is not None

    @property
    def engine_fault(self) -> str | None:
        """Why the engine failed every request (device lost, out of memory), if it did."""
        return self.service.fault if self.service is not None else None

    def require_ready(self) -> tuple[TTSService, VoiceResolver]:
        if self.service is None or self.resolver is None:
            if self.load_error:
                raise APIError(503, f"The model failed to load: {self.load_error}", code="model_load_failed")
            raise not_ready()
        return self.service, self.resolver

    def close(self) -> None:
        if self._loader is not None:
            self._loader.join()
        if self.service is not None and self._owns_service:
            self.service.close()
        self.store.close()


def get_state(request: Request) -> AppState:
    return request.app.state.pcgtts


def get_ws_state(websocket: WebSocket) -> AppState:
    return websocket.app.state.pcgtts
