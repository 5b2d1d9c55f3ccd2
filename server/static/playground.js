// pcgtts playground: WebSocket streaming + gapless Web Audio playback. No build step, no dependencies.
"use strict";

const $ = (id) => document.getElementById(id);

// Everything a test (or a curious user in the console) may want to read.
const stats = window.playground = {
  status: "idle", receivedSamples: 0, scheduledSamples: 0, audioSeconds: 0, ttfaMs: null,
  acceptanceRate: null, tokens: 0, underruns: 0, utterancesDone: 0, sampleRate: null, errors: [],
  trace: [], meanAcceptedLen: null,  // per-chunk acceptance (audio.progress `chunk`) of the current utterance
  maxGamma: null, modelCard: null,  // from GET /v1/models
  words: [],  // audio.alignment's words of the current utterance: {text, start, end} in samples
  // Seconds of the current utterance the audio clock has already played (reads the AudioContext).
  get playedSeconds() { return player ? player.playedSeconds() : 0; },
  get contextState() { return player ? player.ctx.state : "none"; },
};

function apiKey() { return $("api-key").value.trim(); }
function authHeaders() { return apiKey() ? { Authorization: `Bearer ${apiKey()}` } : {}; }

function setStatus(text) { stats.status = text; $("status").textContent = text; }

async function errorText(response) {
  try { return (await response.json()).error.message; } catch (_) { return `HTTP ${response.status}`; }
}

// ---------------------------------------------------------------------------------------------- voices
// Calls can overlap (page load, an upload, an API-key change): only the latest one's answer is drawn, and
// it keeps the current selection unless told which voice to select.
let voicesRequest = 0;
async function loadVoices(select) {
  const request = ++voicesRequest;
  const response = await fetch("/v1/audio/voices", { headers: authHeaders() });
  if (!response.ok) { setStatus(`voices: ${await errorText(response)}`); return; }
  const body = await response.json();
  if (request !== voicesRequest) return;
  const box = $("voice");
  select = select || box.value;
  box.replaceChildren();
  for (const v of body.data) {
    const option = new Option(v.kind === "preset" ? v.name : `${v.name} (uploaded)`, v.id);
    option.dataset.kind = v.kind;
    box.append(option);
  }
  if ([...box.options].some((o) => o.value === select)) box.value = select;
}

async function loadRules() {
  const response = await fetch("/v1/models", { headers: authHeaders() });
  if (!response.ok) return;
  const model = (await response.json()).data[0];
  stats.maxGamma = (model.pcgtts && model.pcgtts.num_speculative_tokens) || 0;
  stats.modelCard = model.pcgtts || {};
  document.dispatchEvent(new CustomEvent("playground:model", { detail: stats.modelCard }));
  for (const rule of (model.pcgtts && model.pcgtts.acceptance_rules) || []) {
    $("acceptance").append(new Option(rule, rule));
  }
  for (const table of (model.pcgtts && model.pcgtts.asg_tables) || []) {
    $("asg-table").append(new Option(table, table));
  }
}

$("upload").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = new FormData($("upload"));
  $("upload-status").textContent = "uploading…";
  const response = await fetch("/v1/audio/voices", { method: "POST", body: form, headers: authHeaders() });
  if (!response.ok) { $("upload-status").textContent = await errorText(response); return; }
  const voice = await response.json();
  await loadVoices(voice.id);
  $("upload-status").textContent = `uploaded “${voice.name}”`;
});

// ----------------------------------------------------------------------------------------------- charts
const COLORS = { drafted: "rgba(59, 111, 214, 0.28)", accepted: "#3b6fd6", mean: "#e07a1f", wave: "#3b6fd6",
                 text: "#888" };

// Per-chunk acceptance as bars (drafted light, accepted dark, scaled to the largest chunk) and the running
// mean accepted length (tokens per verify step) as a line on a 1..γ+1 scale. minSlots: bar positions drawn
// before the chart starts to compress (a live trace grows into them).
function drawTrace(canvas, chunks, gamma, minSlots = 24) {
  const g = canvas.getContext("2d");
  const { width: w, height: h } = canvas;
  g.clearRect(0, 0, w, h);
  g.font = "11px system-ui, sans-serif";
  if (!chunks.length) return;
  const drafted = chunks.reduce((sum, c) => sum + c.drafted, 0);
  if (!drafted) {
    g.fillStyle = COLORS.text;
    g.fillText("no draft tokens: target-only decoding", 8, h / 2);
    return;
  }
  const slots = Math.max(chunks.length, minSlots);
  const bar = w / slots;
  const top = Math.max(...chunks.map((c) => c.drafted), 1);
  chunks.forEach((c, i) => {
    const x = i * bar + 1;
    const hd = (h - 14) * c.drafted / top;
    const ha = (h - 14) * c.accepted / top;
    g.fillStyle = COLORS.drafted; g.fillRect(x, h - hd, Math.max(bar - 2, 1), hd);
    g.fillStyle = COLORS.accepted; g.fillRect(x, h - ha, Math.max(bar - 2, 1), ha);
  });
  const span = Math.max(gamma || 1, 1);  // mean accepted length lies in [1, γ+1]
  let tokens = 0, steps = 0;
  g.strokeStyle = COLORS.mean; g.lineWidth = 2; g.beginPath();
  chunks.forEach((c, i) => {
    tokens += c.tokens; steps += c.steps;
    const mean = steps ? tokens / steps : 1;
    const y = h - 2 - (h - 16) * (mean - 1) / span;
    const x = i * bar + bar / 2;
    if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
  });
  g.stroke();
  g.fillStyle = COLORS.mean;
  g.fillText(`mean accepted length ${(tokens / Math.max(steps, 1)).toFixed(2)} (1 … ${span + 1})`, 6, 11);
}

// A waveform: the min and max sample of each pixel column.
function drawWave(canvas, pcm) {
  const g = canvas.getContext("2d");
  const { width: w, height: h } = canvas;
  g.clearRect(0, 0, w, h);
  if (!pcm.length) return;
  g.fillStyle = COLORS.wave;
  const per = pcm.length / w;
  for (let x = 0; x < w; x++) {
    let lo = 0, hi = 0;
    for (let i = Math.floor(x * per); i < Math.min(pcm.length, Math.floor((x + 1) * per)); i++) {
      if (pcm[i] < lo) lo = pcm[i];
      if (pcm[i] > hi) hi = pcm[i];
    }
    const y0 = h / 2 - (hi / 32768) * (h / 2);
    const y1 = h / 2 - (lo / 32768) * (h / 2);
    g.fillRect(x, y0, 1, Math.max(y1 - y0, 1));
  }
}

// ---------------------------------------------------------------------------------------------- player
// Chunks are scheduled back to back on the AudioContext clock, so consecutive chunks join sample-exactly.
// The context runs at the stream's rate (the server resamples), so the browser never resamples a chunk.
class PcmPlayer {
  constructor() {
    try { this.ctx = new AudioContext({ sampleRate: 24000, latencyHint: "interactive" }); }
    catch (_) { this.ctx = new AudioContext(); }
    this.next = 0;
    this.first = null;  // context time at which the current utterance starts playing
    this.sources = new Set();
    this.chunks = [];  // {sample, time, length}: where each chunk of the utterance sits on the clock
  }

  // The utterance's sample playing at context time `time` (-1 before its first; a gap holds the last).
  sampleAt(time) {
    for (let i = this.chunks.length - 1; i >= 0; i--) {
      const chunk = this.chunks[i];
      if (chunk.time <= time) return chunk.sample + Math.min(chunk.length, Math.floor((time - chunk.time) * this.rate));
    }
    return -1;
  }

  playedSeconds() {
    if (this.first === null) return 0;
    return Math.max(0, Math.min(this.ctx.currentTime, this.next) - this.first);
  }

  get rate() { return this.ctx.sampleRate; }

  push(buffer) {
    const pcm = new Int16Array(buffer);
    if (!pcm.length) return;
    const floats = new Float32Array(pcm.length);
    for (let i = 0; i < pcm.length; i++) floats[i] = pcm[i] / 32768;
    const audio = this.ctx.createBuffer(1, floats.length, this.rate);
    audio.copyToChannel(floats, 0);
    const source = this.ctx.createBufferSource();
    source.buffer = audio;
    source.connect(this.ctx.destination);
    const now = this.ctx.currentTime;
    if (this.next === 0) this.next = this.first = now + 0.05;  // a small jitter buffer before the first chunk
    else if (this.next < now) { stats.underruns += 1; this.next = now + 0.02; }
    source.start(this.next);
    this.chunks.push({ sample: stats.scheduledSamples, time: this.next, length: pcm.length });
    this.next += audio.duration;
    this.sources.add(source);
    source.onended = () => this.sources.delete(source);
    stats.scheduledSamples += pcm.length;
  }

  stop() {
    for (const source of this.sources) { try { source.stop(); } catch (_) { /* already stopped */ } }
    this.sources.clear();
    this.next = 0;
    this.first = null;
    this.chunks = [];
  }
}

// ----------------------------------------------------------------------------------------------- words
// audio.alignment says where each word lies in the stream's samples and the player knows when each sample
// plays, so the word under the audio clock is highlighted while it is heard.
const shownWords = { spans: [], current: -1 };

function resetWords() {
  stats.words = [];
  shownWords.spans = [];
  shownWords.current = -1;
  $("words").replaceChildren();
}

function addWords(words) {
  for (const word of words) {
    const span = document.createElement("span");
    span.className = "word";
    span.textContent = word.text;
    $("words").append(span, " ");
    stats.words.push(word);
    shownWords.spans.push(span);
  }
}

function highlightWords() {
  const heard = player ? player.sampleAt(player.ctx.currentTime) : -1;
  let now = -1;
  stats.words.forEach((word, i) => { if (word.start <= heard && heard < word.end) now = i; });
  if (now !== shownWords.current) {
    const before = shownWords.spans[shownWords.current];
    if (before) before.classList.replace("heard", "said");
    if (now >= 0) shownWords.spans[now].classList.add("heard");
    shownWords.current = now;
  }
  requestAnimationFrame(highlightWords);
}
requestAnimationFrame(highlightWords);

// ------------------------------------------------------------------------------------------- streaming
let player = null;
let socket = null;
let startedAt = 0;
let firstAudio = false;

function socketUrl() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  return `${scheme}://${location.host}/v1/audio/speech/stream`;
}

// The API key travels as a subprotocol (base64url), never in the URL, where logs and history keep it.
function socketProtocols() {
  if (!apiKey()) return [];
  const b64 = btoa(String.fromCharCode(...new TextEncoder().encode(apiKey())));
  return ["pcgtts", "pcgtts.bearer." + b64.replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "")];
}

function openSocket() {
  if (socket && socket.readyState <= WebSocket.OPEN) return Promise.resolve(socket);
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(socketUrl(), socketProtocols());
    ws.binaryType = "arraybuffer";
    ws.onopen = () => { socket = ws; resolve(ws); };
    ws.onerror = () => reject(new Error("WebSocket failed"));
    ws.onclose = () => { if (socket === ws) socket = null; $("stop").disabled = true; };
    ws.onmessage = onMessage;
  });
}

function onMessage(event) {
  if (event.data instanceof ArrayBuffer) {
    if (!firstAudio) {
      firstAudio = true;
      stats.ttfaMs = Math.round(performance.now() - startedAt);
      $("ttfa").textContent = `${stats.ttfaMs} ms`;
      setStatus("playing");
    }
    const samples = event.data.byteLength / 2;
    stats.receivedSamples += samples;
    stats.audioSeconds += samples / player.rate;
    player.push(event.data);
    $("received-samples").textContent = stats.receivedSamples.toLocaleString("en");
    $("audio-seconds").textContent = `${stats.audioSeconds.toFixed(2)} s`;
    $("underruns").textContent = String(stats.underruns);
    return;
  }
  const message = JSON.parse(event.data);
  if (message.type === "audio.progress" || message.type === "audio.done") {
    stats.tokens = message.tokens ?? stats.tokens;
    stats.acceptanceRate = message.acceptance_rate ?? stats.acceptanceRate;
    $("tokens").textContent = String(stats.tokens);
    $("acceptance-rate").textContent =
      stats.acceptanceRate == null ? "n/a (no draft)" : `${(100 * stats.acceptanceRate).toFixed(1)} %`;
    stats.meanAcceptedLen = message.mean_accepted_len ?? stats.meanAcceptedLen;
    $("mean-accepted-len").textContent = stats.meanAcceptedLen == null ? "–" : stats.meanAcceptedLen.toFixed(2);
  }
  if (message.type === "audio.alignment") addWords(message.words);
  if (message.type === "audio.progress") {
    stats.trace.push(message.chunk);
    drawTrace($("trace"), stats.trace, stats.maxGamma);
  }
  if (message.type === "audio.done") {
    stats.utterancesDone += 1;
    setStatus(message.cancelled ? "stopped" : "done");
    $("speak").disabled = false;
    $("stop").disabled = true;
  } else if (message.type === "error") {
    stats.errors.push(message.error);
    setStatus(`error: ${message.error.message}`);
    $("speak").disabled = false;
    $("stop").disabled = true;
  }
}

function sessionConfig() {
  const config = { type: "session.config", sample_rate: player ? player.rate : 24000,
                   speed: Number($("speed").value) || 1, word_timings: true };
  const option = $("voice").selectedOptions[0];
  if (option) config.voice = option.dataset.kind === "uploaded" ? { id: option.value } : option.value;
  if ($("temperature").value !== "") config.temperature = Number($("temperature").value);
  if ($("seed").value !== "") config.seed = Number($("seed").value);
  if ($("acceptance").value) config.acceptance = $("acceptance").value;
  if ($("asg-table").value) config.asg_table = $("asg-table").value;
  return config;
}

$("speak").addEventListener("click", async () => {
  const text = $("text").value.trim();
  if (!text) return;
  player = player || new PcmPlayer();
  await player.ctx.resume();
  player.stop();
  stats.sampleRate = player.rate;
  Object.assign(stats, { receivedSamples: 0, scheduledSamples: 0, audioSeconds: 0, ttfaMs: null, underruns: 0,
                         acceptanceRate: null, tokens: 0, trace: [], meanAcceptedLen: null });
  drawTrace($("trace"), [], stats.maxGamma);
  resetWords();
  $("ttfa").textContent = "…";
  $("speak").disabled = true;
  $("stop").disabled = false;
  setStatus("connecting");
  try {
    const ws = await openSocket();
    firstAudio = false;
    startedAt = performance.now();
    setStatus("generating");
    ws.send(JSON.stringify(sessionConfig()));
    ws.send(JSON.stringify({ type: "input.text", text }));
    ws.send(JSON.stringify({ type: "input.done" }));
  } catch (err) {
    setStatus(String(err));
    $("speak").disabled = false;
  }
});

$("stop").addEventListener("click", () => {
  if (socket) socket.send(JSON.stringify({ type: "input.cancel" }));
  if (player) player.stop();
});

$("api-key").value = localStorage.getItem("pcgtts-api-key") || "";
$("api-key").addEventListener("change", () => {
  localStorage.setItem("pcgtts-api-key", apiKey());
  loadVoices();
});

Promise.all([loadVoices(), loadRules()]).then(() => { if (stats.status === "idle") setStatus("ready"); });
