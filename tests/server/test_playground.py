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


def painted_pixels(page, selector: str) -> int:
    """How many pixels of a canvas have been drawn on (alpha > 0)."""
    return page.eval_on_selector(selector, """canvas => {
      const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
      let n = 0;
      for (let i = 3; i < data.length; i += 4) if (data[i] > 0) n++;
      return n;
    }""")


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
    # The live acceptance trace: one entry per audio.progress, drawn as it arrived.
    trace = stats["trace"]
    assert len(trace) >= 2 and sum(c["drafted"] for c in trace) > 0
    assert all(0 <= c["accepted"] <= c["drafted"] for c in trace)
    mean = sum(c["tokens"] for c in trace) / sum(c["steps"] for c in trace)
    assert 1.0 <= mean <= stats["maxGamma"] + 1
    assert abs(float(page.inner_text("#mean-accepted-len")) - stats["meanAcceptedLen"]) < 0.01
    assert painted_pixels(page, "#trace") > 200
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
  const response = await fetch("/v1/audio/speech", {method: "POST",
    headers: {"Content-Type": "application/json"},
    body: JSON.stringify({model: "tts-1", voice: "alloy", input: "Decode me in the browser.", seed: 3,
                          response_format: fmt, stream})});
  const bytes = await response.arrayBuffer();
  if (fmt === "pcm") return {samples: bytes.byteLength / 2};
  const audio = await new OfflineAudioContext(1, 1, 24000).decodeAudioData(bytes);
  const chunked = response.headers.get("content-length") === null;
  return {samples: audio.length, rate: audio.sampleRate, chunked};
}"""


def test_chromium_decodes_streamed_and_whole_flac(page):
    """A streamed FLAC (STREAMINFO without a length) and a whole one decode to every sample in Chromium."""
    pcm = page.evaluate(DECODE_IN_BROWSER, {"fmt": "pcm", "stream": True})["samples"]
    streamed = page.evaluate(DECODE_IN_BROWSER, {"fmt": "flac", "stream": True})
    whole = page.evaluate(DECODE_IN_BROWSER, {"fmt": "flac", "stream": False})
    assert pcm > 4800
    assert streamed["chunked"] and not whole["chunked"]
    assert streamed["samples"] == whole["samples"] == pcm and streamed["rate"] == 24000


def test_ab_mode_speaks_both_settings_over_several_seeds_and_plays_either(browser, live_server):
    """A/B: the same text and voice under exact and PCG verification, over 3 seeds each (alternating A and
    B), so one run cannot mislead: each side shows its median and range over the seeds, the page the
    per-seed difference B − A; each side shows its first seed's waveform and trace, and plays on a click.
    Screenshot: artifacts/playground-ab.png."""
    page = new_page(browser, live_server, height=1600)
    page.goto(live_server.url + "/")
    page.wait_for_function("window.playground && window.playground.status === 'ready'", timeout=30_000)
    page.fill("#text", "Compare the two settings, side by side.")
    page.fill("#seed", "4")
    page.fill("#ab-runs", "3")
    page.select_option("#ab-a-acceptance", "exact")
    page.select_option("#ab-b-acceptance", "pcg")
    page.click("#ab-run")
    page.wait_for_function("['done'].includes(window.playground.ab.status) || "
                           "window.playground.ab.status.startsWith('error')", timeout=400_000)
    ab = page.evaluate("""() => Object.fromEntries(["A", "B"].map(side => {
      const r = window.playground.ab[side];
      return [side, {samples: r.pcm.length, ttfaMs: r.ttfaMs, tokensPerSecond: r.tokensPerSecond,
                     done: r.done, chunks: r.trace.length, config: r.config, runs: r.runs}];
    }))""")
    assert page.evaluate("window.playground.ab.status") == "done"
    for side, rule in (("A", "exact"), ("B", "pcg")):
        r = ab[side]
        assert r["config"]["acceptance"] == rule and r["config"]["seed"] == 4
        assert [run["seed"] for run in r["runs"]] == [4, 5, 6]
        assert r["samples"] > 4800 and r["samples"] == r["done"]["samples"]
        assert r["ttfaMs"] > 0 and r["tokensPerSecond"] > 0 and r["chunks"] >= 1
        assert 0 <= r["done"]["acceptance_rate"] <= 1 and r["done"]["drafted"] > 0
        assert painted_pixels(page, f"#ab-{side.lower()}-wave") > 200
        assert painted_pixels(page, f"#ab-{side.lower()}-trace") > 50
        rates = sorted(100 * run["acceptanceRate"] for run in r["runs"])
        shown = page.inner_text(f"#ab-{side.lower()}-stats dd[data-key='acceptance rate']")
        assert shown == f"{rates[1]:.1f} ({rates[0]:.1f}–{rates[2]:.1f}) %"  # median (min–max)
        assert page.inner_text(f"#ab-{side.lower()}-stats dd[data-key='seeds']") == "4, 5, 6"
    pairs = zip(ab["A"]["runs"], ab["B"]["runs"], strict=True)
    diffs = [100 * (b["acceptanceRate"] - a["acceptanceRate"]) for a, b in pairs]
    assert page.evaluate("window.playground.ab.acceptanceDiffs") == pytest.approx(diffs)
    assert "over 3 seeds" in page.inner_text("#ab-difference")
    page.click("#ab-b-play")
    page.wait_for_function("window.playground.ab.playing === 'B' && window.playground.ab.playedSeconds > 0.2",
                           timeout=30_000)
    page.click("#ab-a-play")  # one click switches to the other side
    page.wait_for_function("window.playground.ab.playing === 'A'", timeout=10_000)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "playground-ab.png"), full_page=True)
    assert page.errors == [] and page.offsite == []
    page.close()


def test_the_page_has_an_icon_and_asks_for_nothing_missing(browser, live_server):
    """The favicon is served (browsers ask for it on every page) and the page loads nothing that 404s. (A
    plain page: Playwright's request routing, which new_page() uses, fails fetches of the favicon.)"""
    page = browser.new_page()
    page.errors = []
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    missing = []
    page.on("response", lambda response: missing.append(response.url) if response.status == 404 else None)
    page.goto(live_server.url + "/")
    page.wait_for_function("window.playground && window.playground.status === 'ready'", timeout=30_000)
    icon = page.evaluate("""async () => {
      const link = document.querySelector("link[rel=icon]");
      const response = await fetch(link.href);
      return {href: link.getAttribute("href"), status: response.status,
              type: response.headers.get("content-type"),
              head: Array.from(new Uint8Array(await response.arrayBuffer()).slice(0, 4))};
    }""")
    assert icon == {"href": "/favicon.ico", "status": 200, "type": "image/x-icon", "head": [0, 0, 1, 0]}
    assert missing == [] and page.errors == []
    page.close()


RECORD_AUDIO_CLOCK = """(() => {
  // The page's audio as the audio clock plays it, recorded beside the page's own code: every buffer source
  // started, with its context time and length.
  window.__clock = { contexts: [], starts: [] };
  const Native = window.AudioContext;
  window.AudioContext = class extends Native {
    constructor(...args) { super(...args); window.__clock.contexts.push(this); }
  };
  const start = AudioBufferSourceNode.prototype.start;
  AudioBufferSourceNode.prototype.start = function (when, ...rest) {
    window.__clock.starts.push({ when, length: this.buffer.length, rate: this.buffer.sampleRate });
    return start.call(this, when, ...rest);
  };
})();"""

WATCH_HIGHLIGHTS = """() => {
  // Each time a word is highlighted: which one, and the audio clock's time then.
  window.__heard = [];
  const box = document.getElementById("words");
  new MutationObserver(records => {
    for (const r of records) {
      if (!r.target.classList.contains("heard")) continue;
      const ctx = window.__clock.contexts[window.__clock.contexts.length - 1];
      window.__heard.push({ index: [...box.children].indexOf(r.target), time: ctx.currentTime });
    }
  }).observe(box, { subtree: true, attributes: true, attributeFilter: ["class"] });
}"""


def clock_time(starts: list[dict], sample: int) -> float:
    """The context time at which the stream's `sample` plays, from the buffer sources started."""
    offset = 0
    for chunk in starts:
        if sample < offset + chunk["length"]:
            return chunk["when"] + (sample - offset) / chunk["rate"]
        offset += chunk["length"]
    return starts[-1]["when"] + (sample - offset + starts[-1]["length"]) / starts[-1]["rate"]


def test_page_highlights_each_word_while_it_is_heard(browser, live_server):
    """Every word of the text lights up once, in order, while the audio clock plays that word's samples
    (checked against the sources the page really started, recorded beside it); a late frame on a busy
    machine may light it up to 0.3 s after the word's end, never before its start."""
    page = new_page(browser, live_server)
    page.add_init_script(RECORD_AUDIO_CLOCK)
    page.goto(live_server.url + "/")
    page.wait_for_function("window.playground && window.playground.status === 'ready'", timeout=30_000)
    page.evaluate(WATCH_HIGHLIGHTS)
    text = "Seven jugglers wandered past the quiet harbour at dawn, humming softly."
    page.fill("#seed", "3")
    stats = speak_and_wait(page, text)
    assert stats["status"] == "done", stats
    words = stats["words"]
    assert [w["text"] for w in words] == text.replace(",", "").replace(".", "").split()
    page.wait_for_function("window.__heard.length >= window.playground.words.length && "
                           "window.playground.playedSeconds >= window.playground.audioSeconds - 0.01",
                           timeout=60_000)
    heard, starts = page.evaluate("window.__heard"), page.evaluate("window.__clock.starts")
    assert sum(c["length"] for c in starts) == stats["receivedSamples"]  # every sample was scheduled
    assert [h["index"] for h in heard] == list(range(len(words)))  # each word, once, in order
    for h in heard:
        word = words[h["index"]]
        begins, ends = clock_time(starts, word["start"]), clock_time(starts, word["end"])
        assert begins - 0.005 <= h["time"] <= ends + 0.3, (word, h, begins, ends)
    assert page.locator("#words .word.said").count() >= len(words) - 1
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "playground-words.png"), full_page=True)
    assert page.errors == [] and page.offsite == []
    page.close()
