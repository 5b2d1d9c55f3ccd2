"""The playground page in headless Debian Chromium (driven by Playwright): voices listed, a voice chosen,
audio streamed over the WebSocket and scheduled for playback, a voice uploaded through the form.
A screenshot lands in artifacts/playground.png."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import soundfile as sf
from server_support import tone
from system_support import require_program

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--autoplay-policy=no-user-gesture-required"]

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def page(live_server):
    chromium = require_program("chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1000, "height": 1100})
        page.errors = []
        page.on("pageerror", lambda exc: page.errors.append(str(exc)))
        page.goto(live_server.url + "/")
        page.wait_for_function("window.playground && window.playground.status === 'ready'", timeout=30_000)
        yield page
        browser.close()


def speak_and_wait(page, text: str) -> dict:
    page.fill("#text", text)
    page.click("#speak")
    page.wait_for_function("['done', 'stopped'].includes(window.playground.status) || "
                           "window.playground.status.startsWith('error')", timeout=120_000)
    return page.evaluate("window.playground")


def test_page_streams_and_plays_a_chosen_voice(page):
    options = page.locator("#voice option")
    assert options.count() >= 1
    page.select_option("#voice", index=options.count() - 1)
    tables = page.locator("#asg-table option")
    assert tables.count() >= 2  # "server default" and the tables GET /v1/models lists
    page.select_option("#acceptance", "pcg")
    page.select_option("#asg-table", index=tables.count() - 1)
    page.fill("#seed", "7")
    stats = speak_and_wait(page, "Hello from the browser playground.")
    assert stats["status"] == "done", stats
    assert stats["sampleRate"] == 24000
    assert stats["receivedSamples"] > 4800
    assert stats["scheduledSamples"] == stats["receivedSamples"]  # every received sample was queued to play
    assert stats["ttfaMs"] > 0 and stats["tokens"] > 0 and 0 <= stats["acceptanceRate"] <= 1
    # The audio clock really plays what was scheduled (headless Chromium has a running AudioContext).
    assert page.evaluate("window.playground.contextState") == "running"
    page.wait_for_function("window.playground.playedSeconds > 0.5", timeout=30_000)
    shown = page.inner_text("#received-samples").replace(",", "")
    assert int(shown) == stats["receivedSamples"]
    assert page.inner_text("#ttfa").endswith("ms") and page.inner_text("#acceptance-rate").endswith("%")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "playground.png"), full_page=True)
    assert page.errors == []


def test_page_uploads_a_voice_and_speaks_with_it(page):
    buf = io.BytesIO()
    sf.write(buf, tone(2.0), 22050, format="WAV")
    page.fill("#voice-name", "browser-voice")
    page.fill("#voice-transcript", "a clip uploaded from the page")
    page.set_input_files("#voice-file", files=[{"name": "clip.wav", "mimeType": "audio/wav",
                                                "buffer": buf.getvalue()}])
    page.click("#upload button[type=submit]")
    page.wait_for_function("document.querySelector('#upload-status').textContent.startsWith('uploaded')",
                           timeout=60_000)
    selected = page.eval_on_selector("#voice", "el => el.selectedOptions[0].textContent")
    assert selected == "browser-voice (uploaded)"
    stats = speak_and_wait(page, "Now with my uploaded voice.")
    assert stats["status"] == "done" and stats["receivedSamples"] > 4800
    assert page.errors == []
