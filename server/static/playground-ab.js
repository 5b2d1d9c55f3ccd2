// pcgtts playground, A/B mode: the same text, voice and seed spoken under two settings (acceptance rule,
// ASG table θ, draft length γ), one after the other, each on its own WebSocket session. Shows each side's
// waveform, acceptance trace, time to first audio, tokens/s and acceptance, and plays either on a click.
// Uses the helpers of playground.js ($, stats, socketUrl, socketProtocols, sessionConfig, drawTrace, drawWave).
"use strict";

const ab = stats.ab = { status: "idle", A: null, B: null, playing: null };
let abContext = null;
let abSource = null;

// Side A and side B from the page's one template: each part gets the id ab-<side>-<part>.
for (const side of ["A", "B"]) {
  const node = $("ab-side-template").content.firstElementChild.cloneNode(true);
  node.dataset.side = side;
  node.querySelector("h3").textContent = side;
  for (const part of node.querySelectorAll("[data-part]")) part.id = `ab-${side.toLowerCase()}-${part.dataset.part}`;
  node.querySelector("[data-part=play]").textContent = `▶ Play ${side}`;
  node.querySelector("[data-part=wave]").setAttribute("aria-label", `waveform ${side}`);
  node.querySelector("[data-part=trace]").setAttribute("aria-label", `acceptance trace ${side}`);
  $("ab-grid").append(node);
}

function sideIds(side) {
  const p = `ab-${side.toLowerCase()}`;
  return { acceptance: `${p}-acceptance`, table: `${p}-asg-table`, gamma: `${p}-gamma`, wave: `${p}-wave`,
           trace: `${p}-trace`, stats: `${p}-stats`, play: `${p}-play` };
}

// The choices GET /v1/models offers; A defaults to exact verification, B to PCG (when tables are loaded).
function fillChoices(card) {
  const rules = card.acceptance_rules || [];
  for (const [side, preferred] of [["A", "exact"], ["B", "pcg"]]) {
    const ids = sideIds(side);
    for (const rule of rules) $(ids.acceptance).append(new Option(rule, rule));
    $(ids.acceptance).value = rules.includes(preferred) ? preferred : (rules[0] || "");
    for (const table of card.asg_tables || []) $(ids.table).append(new Option(table, table));
    $(ids.gamma).max = String(card.num_speculative_tokens || 1);
    $(ids.gamma).value = String(card.num_speculative_tokens || 1);
  }
}
// /v1/models may have answered before this script ran.
if (stats.modelCard) fillChoices(stats.modelCard);
else document.addEventListener("playground:model", (event) => fillChoices(event.detail), { once: true });

function sideConfig(side) {
  const ids = sideIds(side);
  const config = { ...sessionConfig(), sample_rate: 24000, speed: 1 };
  if (config.seed === undefined) config.seed = 1;  // the point of A/B: both sides draw the same randomness
  if ($(ids.acceptance).value) config.acceptance = $(ids.acceptance).value;
  if ($(ids.table).value) config.asg_table = $(ids.table).value;
  if ($(ids.gamma).value !== "") config.num_speculative_tokens = Number($(ids.gamma).value);
  return config;
}

// One utterance on a fresh session: resolves with its PCM, acceptance trace and timings.
function runSide(config, text) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(socketUrl(), socketProtocols());  // the API key travels as a subprotocol
    ws.binaryType = "arraybuffer";
    const parts = [];
    const trace = [];
    let sentAt = 0, firstAt = null;
    ws.onopen = () => {
      sentAt = performance.now();
      ws.send(JSON.stringify(config));
      ws.send(JSON.stringify({ type: "input.text", text }));
      ws.send(JSON.stringify({ type: "input.done" }));
    };
    ws.onerror = () => reject(new Error("WebSocket failed"));
    ws.onmessage = (event) => {
      if (event.data instanceof ArrayBuffer) {
        if (firstAt === null) firstAt = performance.now();
        parts.push(new Int16Array(event.data));
        return;
      }
      const message = JSON.parse(event.data);
      if (message.type === "audio.progress") trace.push(message.chunk);
      else if (message.type === "error") { ws.close(); reject(new Error(message.error.message)); }
      else if (message.type === "audio.done") {
        const seconds = (performance.now() - sentAt) / 1000;
        const pcm = new Int16Array(parts.reduce((n, p) => n + p.length, 0));
        let at = 0;
        for (const p of parts) { pcm.set(p, at); at += p.length; }
        ws.send(JSON.stringify({ type: "session.close" }));
        resolve({ pcm, trace, done: message, ttfaMs: firstAt === null ? null : Math.round(firstAt - sentAt),
                  tokensPerSecond: message.tokens / seconds, config });
      }
    };
  });
}

function showSide(side, result) {
  const ids = sideIds(side);
  const d = result.done;
  const pct = (x) => (x == null ? "n/a (no draft)" : `${(100 * x).toFixed(1)} %`);
  const rows = [
    ["setting", `${result.config.acceptance || "default"}${result.config.asg_table ? ` · ${result.config.asg_table}` : ""}` +
                ` · γ ${result.config.num_speculative_tokens ?? "default"}`],
    ["time to first audio", `${result.ttfaMs} ms`],
    ["tokens/s", result.tokensPerSecond.toFixed(1)],
    ["acceptance rate", pct(d.acceptance_rate)],
    ["mean accepted length", d.mean_accepted_len == null ? "–" : d.mean_accepted_len.toFixed(2)],
    ["tokens / verify steps", `${d.tokens} / ${d.steps}`],
    ["audio", `${d.audio_seconds.toFixed(2)} s`],
  ];
  $(ids.stats).replaceChildren(...rows.flatMap(([k, v]) => {
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = v; dd.dataset.key = k;
    return [dt, dd];
  }));
  drawWave($(ids.wave), result.pcm);
  drawTrace($(ids.trace), result.trace, stats.maxGamma, 1);  // finished: the whole width
  $(ids.play).disabled = result.pcm.length === 0;
}

function setAbStatus(text) { ab.status = text; $("ab-status").textContent = text; }

$("ab-run").addEventListener("click", async () => {
  const text = $("text").value.trim();
  if (!text) return;
  $("ab-run").disabled = true;
  try {
    for (const side of ["A", "B"]) {
      setAbStatus(`speaking ${side}…`);
      ab[side] = await runSide(sideConfig(side), text);
      showSide(side, ab[side]);
    }
    setAbStatus("done");
  } catch (err) {
    setAbStatus(`error: ${err.message}`);
  } finally {
    $("ab-run").disabled = false;
  }
});

function playSide(side) {
  const result = ab[side];
  if (!result) return;
  abContext = abContext || new AudioContext({ sampleRate: 24000 });
  abContext.resume();
  if (abSource) { try { abSource.stop(); } catch (_) { /* already ended */ } }
  const buffer = abContext.createBuffer(1, result.pcm.length, 24000);
  const floats = new Float32Array(result.pcm.length);
  for (let i = 0; i < floats.length; i++) floats[i] = result.pcm[i] / 32768;
  buffer.copyToChannel(floats, 0);
  abSource = abContext.createBufferSource();
  abSource.buffer = buffer;
  abSource.connect(abContext.destination);
  const started = abContext.currentTime;
  abSource.onended = () => { if (ab.playing === side) ab.playing = null; };
  abSource.start();
  ab.playing = side;
  ab.playStartedAt = started;
}

Object.defineProperty(ab, "playedSeconds", {
  get() { return abContext && ab.playing ? abContext.currentTime - ab.playStartedAt : 0; },
});
for (const side of ["A", "B"]) $(sideIds(side).play).addEventListener("click", () => playSide(side));
