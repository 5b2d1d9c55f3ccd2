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
def browser():
    chromium = require_program("chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


def new_page(browser, live_server, height: int = 1100):
    """A page whose requests may only reach the live server: anything else is aborted and recorded, so a
    page that needs the internet (a CDN) fails its test instead of passing on a connected machine."""
    page = browser.new_page(viewport={"width": 1000, "height": height})
    page.errors, page.offsite = [], []
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))

    def only_local(route):
        if route.request.url.startswith(live_server.url):
            route.continue_()
        else:
            page.offsite.append(route.request.url)
            route.abort()

    page.route("**/*", only_local)
    return page


@pytest.fixture(scope="module")
def page(browser, live_server):
    page = new_page(browser, live_server)
    page.goto(live_server.url + "/")
    page.wait_for_function("window.playground && window.playground.status === 'ready'", timeout=30_000)
    yield page
    page.close()


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


def test_docs_render_with_no_network(browser, live_server):
    """/docs loads Swagger UI from the server itself (the fastapi-offline wheel's assets), no CDN."""
    page = new_page(browser, live_server)
    page.goto(live_server.url + "/docs")
    page.wait_for_selector(".swagger-ui .info .title", timeout=30_000)
    assert page.inner_text(".swagger-ui .info .title").startswith("pcgtts")
    # the operations, rendered from the server's openapi.json
    page.wait_for_selector(".opblock-summary-path[data-path='/v1/audio/speech']", timeout=30_000)
    assert page.offsite == [] and page.errors == []
    page.close()


DECODE_IN_BROWSER = """async ({fmt, stream}) => {
  const response = await fetch("/v1/audio/speech", {method: "POST", headers: {"Content-Type": "application/json"},
    body: JSON.stringify({model: "tts-1", voice: "alloy", input: "Decode me in the browser.", seed: 3,
                          response_format: fmt, stream})});
  const bytes = await response.arrayBuffer();
  if (fmt === "pcm") return {samples: bytes.byteLength / 2};
  const audio = await new OfflineAudioContext(1, 1, 24000).decodeAudioData(bytes);
  return {samples: audio.length, rate: audio.sampleRate, chunked: response.headers.get("content-length") === null};
}"""


def test_chromium_decodes_streamed_and_whole_flac(page):
    """A streamed FLAC (STREAMINFO without a length) and a whole one both decode to every sample in Chromium."""
    pcm = page.evaluate(DECODE_IN_BROWSER, {"fmt": "pcm", "stream": True})["samples"]
    streamed = page.evaluate(DECODE_IN_BROWSER, {"fmt": "flac", "stream": True})
    whole = page.evaluate(DECODE_IN_BROWSER, {"fmt": "flac", "stream": False})
    assert pcm > 4800
    assert streamed["chunked"] and not whole["chunked"]
    assert streamed["samples"] == whole["samples"] == pcm and streamed["rate"] == 24000
