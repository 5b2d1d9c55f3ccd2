"""The playground against a server that requires an API key: the page sends the key as a WebSocket
subprotocol (never in the URL) from the server's own origin, and speaks."""

from __future__ import annotations

import pytest
from pcgtts.server.settings import ServerSettings
from server_support import LiveServer, free_port
from system_support import require_program
from test_playground import CHROMIUM_FLAGS, speak_and_wait

pytestmark = pytest.mark.browser
KEY = "playground-key"


@pytest.fixture(scope="module")
def keyed_server(demo_bundle, tts_service, tmp_path_factory):
    settings = ServerSettings(model=str(demo_bundle), port=free_port(), api_key=KEY,
                              data_dir=str(tmp_path_factory.mktemp("keyed")))
    server = LiveServer(settings, tts_service).start()
    yield server
    server.stop()


def test_page_streams_with_an_api_key_sent_as_a_subprotocol(keyed_server):
    chromium = require_program("chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
        page = browser.new_page()
        errors, sockets = [], []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("websocket", lambda ws: sockets.append(ws.url))
        page.add_init_script(f"localStorage.setItem('pcgtts-api-key', '{KEY}')")
        page.goto(keyed_server.url + "/")
        page.wait_for_function("window.playground && window.playground.status === 'ready'", timeout=30_000)
        stats = speak_and_wait(page, "Hello with a key.")
        browser.close()
    assert stats["status"] == "done" and stats["receivedSamples"] > 4800, stats
    assert sockets and all(KEY not in url and "api_key" not in url for url in sockets), sockets
    assert errors == []
