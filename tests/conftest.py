"""Shared fixtures: one model bundle and one TTS service per session, a live server per test module.

Tests sit by area (tests/engine, tests/acceptance, tests/tts, tests/server, ...); an area's own fixtures
live in its conftest.py. The code under test is imported by its installed name (`pcgtts.engine`, ...), so a
test folder named like a room never shadows it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def demo_bundle(tmp_path_factory):
    """$PCGTTS_TEST_MODEL if set; else the embedded model when its weights exist; else a tiny random
    bundle with the real family and codec."""
    import os
    from pathlib import Path

    from pcgtts.tts.bundle import DEFAULT_MODEL_DIR
    from server_support import build_tiny_bundle, embedded_model_ready

    if os.environ.get("PCGTTS_TEST_MODEL"):
        return Path(os.environ["PCGTTS_TEST_MODEL"])
    if embedded_model_ready():
        return DEFAULT_MODEL_DIR
    return build_tiny_bundle(tmp_path_factory.mktemp("tiny-bundle"))


@pytest.fixture(scope="session")
def tts_service(demo_bundle):
    from pcgtts.tts import TTSConfig, TTSService

    service = TTSService.load(TTSConfig(model_dir=demo_bundle))
    yield service
    service.close()


@pytest.fixture(scope="module")
def live_server(demo_bundle, tts_service, tmp_path_factory):
    """A real uvicorn server on a loopback port serving the shared TTS service, one per test module."""
    from pcgtts.server.settings import ServerSettings
    from server_support import LiveServer, free_port

    settings = ServerSettings(model=str(demo_bundle), port=free_port(),
                              data_dir=str(tmp_path_factory.mktemp("server-data")))
    server = LiveServer(settings, tts_service).start()
    yield server
    server.stop()
