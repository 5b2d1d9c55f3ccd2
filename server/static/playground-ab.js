// pcgtts playground, A/B mode: the same text and voice spoken under two settings (acceptance rule, ASG
// table θ, draft length γ), each on its own WebSocket session, over several seeds (A and B alternate seed by
// seed, so a drifting machine slows both alike). One run varies a lot from seed to seed, so each side shows
// the median and the range over its seeds, and the per-seed difference B − A; its waveform, acceptance trace
// and player are its first seed's. Uses the helpers of playground.js ($, stats, socketUrl, socketProtocols,
// sessionConfig, drawTrace, drawWave).
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
  return { acceptance: `${p}-acceptance`, table: `${p}-asg-table`, draftTokens: `${p}-draft-tokens`,
           wave: `${p}-wave`, trace: `${p}-trace`, stats: `${p}-stats`, play: `${p}-play` };
}

// The choices GET /v1/models offers; A defaults to exact verification, B to PCG (when tables are loaded).
function fillChoices(card) {
  const rules = card.acceptance_rules || [];
  for (const [side, preferred] of [["A", "exact"], ["B", "pcg"]]) {
    const ids = sideIds(side);
    for (const rule of rules) $(ids.acceptance).append(new Option(rule, rule));
    $(ids.acceptance).value = rules.includes(preferred) ? preferred : (rules[0] || "");
    for (const table of card.asg_tables || []) $(ids.table).append(new Option(table, table));
    $(ids.draftTokens).max = String(card.num_speculative_tokens || 1);
    $(ids.draftTokens).value = String(card.num_speculative_tokens || 1);
  }
}
// /v1/models may have answered before this script ran.
if (stats.modelCard) fillChoices(stats.modelCard);
else document.addEventListener("playground:model", (event) => fillChoices(event.detail), { once: true });

function sideConfig(side, seedOffset) {
  const ids = sideIds(side);
  const config = { ...sessionConfig(), sample_rate: 24000, speed: 1 };
  // the point of A/B: both sides draw the same randomness, seed for seed
  config.seed = (config.seed === undefined ? 1 : config.seed) + seedOffset;
  if ($(ids.acceptance).value) config.acceptance = $(ids.acceptance).value;
  if ($(ids.table).value) config.asg_table = $(ids.table).value;
  if ($(ids.draftTokens).value !== "") config.num_speculative_tokens = Number($(ids.draftTokens).value);
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

// What one run of a side says, for the spread over seeds.
function runFacts(result) {
  const d = result.done;
  return { seed: result.config.seed, acceptanceRate: d.acceptance_rate, meanAcceptedLen: d.mean_accepted_len,
           tokensPerSecond: result.tokensPerSecond, ttfaMs: result.ttfaMs };
}

function medianOf(values) {
  const v = [...values].sort((a, b) => a - b);
  return v.length % 2 ? v[(v.length - 1) / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
}

// "median (min–max) unit" of one fact over a side's runs; `show` formats a number.
function spreadText(runs, key, show, unit = "") {
  const values = runs.map((r) => r[key]).filter((x) => x != null);
  if (!values.length) return "n/a (no draft)";
  if (values.length === 1) return `${show(values[0])}${unit}`;
  return `${show(medianOf(values))} (${show(Math.min(...values))}–${show(Math.max(...values))})${unit}`;
}

const percent = (x) => (100 * x).toFixed(1);

function showSide(side, result) {
  const ids = sideIds(side);
  const d = result.done;
  const runs = result.runs;
  const rows = [
    ["setting", `${result.config.acceptance || "default"}${result.config.asg_table ? ` · ${result.config.asg_table}` : ""}` +
                ` · γ ${result.config.num_speculative_tokens ?? "default"}`],
    ["seeds", runs.map((r) => r.seed).join(", ")],
    ["time to first audio", spreadText(runs, "ttfaMs", Math.round, " ms")],
    ["tokens/s", spreadText(runs, "tokensPerSecond", (x) => x.toFixed(1))],
    ["acceptance rate", spreadText(runs, "acceptanceRate", percent, " %")],
    ["mean accepted length", spreadText(runs, "meanAcceptedLen", (x) => x.toFixed(2))],
    [`tokens / verify steps (seed ${runs[0].seed})`, `${d.tokens} / ${d.steps}`],
    [`audio (seed ${runs[0].seed})`, `${d.audio_seconds.toFixed(2)} s`],
  ];
  $(ids.stats).replaceChildren(...rows.flatMap(([k, v]) => {
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = v; dd.dataset.key = k.split(" (")[0];
    return [dt, dd];
  }));
  drawWave($(ids.wave), result.pcm);
  drawTrace($(ids.trace), result.trace, stats.maxGamma, 1);  // finished: the whole width
  $(ids.play).disabled = result.pcm.length === 0;
}

// B − A per seed (the same seed on both sides), so a difference can be told from run-to-run noise.
function showDifference() {
  const pairs = ab.A.runs.map((a, i) => [a, ab.B.runs[i]])
    .filter(([a, b]) => a.acceptanceRate != null && b.acceptanceRate != null);
  const diffs = pairs.map(([a, b]) => 100 * (b.acceptanceRate - a.acceptanceRate));
  ab.acceptanceDiffs = diffs;
  const points = (x) => `${x >= 0 ? "+" : ""}${x.toFixed(1)}`;
  let text = "acceptance rate B − A: n/a (no draft on one side)";
  if (diffs.length) {
    const lo = Math.min(...diffs), hi = Math.max(...diffs);
    const verdict = diffs.length < 2 ? "one seed: run more before reading a difference"
      : lo > 0 ? "B above A on every seed" : hi < 0 ? "A above B on every seed"
      : "the sign changes from seed to seed: within run-to-run noise";
    text = `acceptance rate B − A, per seed: median ${points(medianOf(diffs))} points ` +
           `(${points(lo)} … ${points(hi)} over ${diffs.length} seeds): ${verdict}`;
  }
  $("ab-difference").textContent = text;
}

function setAbStatus(text) { ab.status = text; $("ab-status").textContent = text; }

$("ab-run").addEventListener("click", async () => {
  const text = $("text").value.trim();
  if (!text) return;
  $("ab-run").disabled = true;
  const seeds = Math.min(Math.max(Number($("ab-runs").value) || 1, 1), 10);
  try {
    const results = { A: [], B: [] };
    for (let i = 0; i < seeds; i++) {
      for (const side of ["A", "B"]) {
        setAbStatus(`speaking ${side}, seed ${i + 1} of ${seeds}…`);
        results[side].push(await runSide(sideConfig(side, i), text));
      }
    }
    for (const side of ["A", "B"]) {
      ab[side] = { ...results[side][0], runs: results[side].map(runFacts) };
      showSide(side, ab[side]);
    }
    showDifference();
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
