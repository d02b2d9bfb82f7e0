// The microphone page: getUserMedia → AudioWorklet (16 kHz PCM16) → /v1/realtime (the GA
// Realtime events: a session.update asks for 16 kHz audio/pcm), the model's words
// (response.output_text.delta) and the server's record of each frame (metronome.frame) drawn
// as they come back. No build step.
"use strict";
const RATE = 16000; // what the worklet makes; the page asks the session for it
const SHOWN_CHARS = 2000; // the words box keeps the end of what was said
const SHOWN_ROWS = 10;
const CHART_FRAMES = 150;
const $ = (id) => document.getElementById(id);
let mic = null; // {ctx, stream, ws}: one session at a time
let frames = []; // the server's rows (metronome.frame), in arrival order
let words = ""; // the model's output so far
let budgetMs = null;
let drawPending = false;

function say(text, kind) {
  const el = $("status");
  el.textContent = text;
  el.className = kind || "";
}

function micRefused(err) {
  if (err.name === "NotAllowedError" || err.name === "SecurityError")
    return "The microphone was refused. Allow it for this site (the icon at the left of the " +
      "address bar) and press Start again.";
  if (err.name === "NotFoundError") return "No microphone found on this machine.";
  if (err.name === "NotReadableError") return "The microphone is busy (another program holds it).";
  return `The microphone could not start: ${err.name}: ${err.message}`;
}

async function start() {
  if (!window.isSecureContext || !navigator.mediaDevices) {
    // Browsers hide getUserMedia on plain http unless the host is localhost.
    say("This page is not a secure context, so the browser offers no microphone: open it " +
      "over https, or as http://localhost:PORT/mic through an SSH tunnel.", "error");
    return;
  }
  $("start").disabled = true;
  let stream;
  try {
    // The model hears what the speaker says: no echo cancelling, denoising or gain riding.
    stream = await navigator.mediaDevices.getUserMedia({audio: {channelCount: 1,
      echoCancellation: false, noiseSuppression: false, autoGainControl: false}});
  } catch (err) {
    say(micRefused(err), "error");
    $("start").disabled = false;
    return;
  }
  const ctx = new AudioContext();
  mic = {ctx, stream, ws: null, live: false, failed: false}; // held from here: release() frees
  if (ctx.sampleRate < RATE) {
    say(`The audio device runs at ${ctx.sampleRate} Hz, below the ${RATE} Hz a session takes.`,
      "error");
    release();
    return;
  }
  await ctx.resume(); // a context made after an await may start suspended
  await ctx.audioWorklet.addModule("/mic/mic-worklet.js");
  const node = new AudioWorkletNode(ctx, "downsampler");
  ctx.createMediaStreamSource(stream).connect(node);
  node.connect(ctx.destination); // pulled by the destination, so it runs; it outputs silence
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const ws = new WebSocket(`${scheme}://${location.host}/v1/realtime`);
  mic.ws = ws;
  frames = [];
  words = "";
  draw();
  say("Connecting to the gateway…");
  node.port.onmessage = (e) => {
    // Audio before session.created is dropped: the session's frame 0 starts at admission.
    if (mic && mic.ws === ws && mic.live && ws.readyState === WebSocket.OPEN)
      ws.send(JSON.stringify({type: "input_audio_buffer.append", audio: base64(e.data)}));
  };
  ws.onmessage = (e) => {
    if (mic && mic.ws === ws) onEvent(JSON.parse(e.data), ws); // none after Stop
  };
  ws.onerror = () => {
    if (mic && mic.ws === ws && !mic.failed) {
      mic.failed = true;
      say(`Could not reach the gateway at ${ws.url}.`, "error");
    }
  };
  ws.onclose = (e) => {
    if (!mic || mic.ws !== ws) return;
    if (!mic.failed) say(`Connection closed (code ${e.code}${e.reason ? ": " + e.reason : ""}).`);
    release();
  };
  $("stop").disabled = false;
}

function onEvent(ev, ws) {
  if (ev.type === "session.created") {
    // The session takes 24 kHz unless asked: ask for what the worklet makes.
    ws.send(JSON.stringify({type: "session.update", session: {type: "realtime",
      output_modalities: ["text"], audio: {input: {format: {type: "audio/pcm", rate: RATE}}}}}));
    say("Connected; setting the session up…");
  } else if (ev.type === "session.updated") {
    const m = ev.session.metronome || {};
    if (m.sample_rate_hz !== RATE) {
      mic.failed = true;
      say(`The session takes ${m.sample_rate_hz} Hz; this page sends ${RATE} Hz.`, "error");
      ws.close(1000);
      return;
    }
    mic.live = true;
    budgetMs = m.budget_ms;
    $("session").textContent = `session ${m.session_id} of run ${m.run_id} · engine ` +
      `${m.engine} · model ${ev.session.model} · ${m.frame_ms} ms frames · ${m.tokens_in} ` +
      `tokens in, ${m.tokens_out} out per frame · budget ${m.budget_ms} ms`;
    say("Live: speak. Each frame below is the server's record of it.", "live");
  } else if (ev.type === "response.output_text.delta" || ev.type === "response.text.delta") {
    words = (words + ev.delta).slice(-SHOWN_CHARS);
    later();
  } else if (ev.type === "metronome.frame") {
    frames.push(ev.frame);
    later();
  } else if (ev.type === "error") {
    const err = ev.error || {};
    if (err.type === "server_overloaded") {
      mic.failed = true;
      say("The server is full: it refused this session (server_overloaded: " +
        `${err.message}). Try again when a session ends.`, "error");
    } else if (err.code === "session_closed") {
      mic.failed = true;
      say(`The server ended this session: ${err.message}.`, "error");
    } else { // the close that may follow must not hide why
      mic.failed = true;
      say(`Server error (${err.code}): ${err.message}`, "error");
    }
  }
}

function later() {
  if (!drawPending) {
    drawPending = true;
    requestAnimationFrame(draw);
  }
}

function base64(buffer) {
  const bytes = new Uint8Array(buffer);
  let s = "";
  for (let i = 0; i < bytes.length; i++) s += String.fromCharCode(bytes[i]);
  return btoa(s);
}

function stop() {
  if (!mic) return;
  say("Stopped. The frames so far are in the run's record.");
  mic.failed = true; // the close that follows is ours, not news
  if (mic.ws) mic.ws.close(1000);
  release();
}

function release() {
  if (!mic) return;
  mic.stream.getTracks().forEach((t) => t.stop());
  mic.ctx.close().catch(() => {});
  mic = null;
  $("start").disabled = false;
  $("stop").disabled = true;
}

// A frame's latency, or, when it never finished (censored), its lower bound shown as "> x".
function latency(row) {
  if (row.latency_ms != null) return {ms: row.latency_ms, text: row.latency_ms.toFixed(1)};
  if (row.latency_bound_ms != null)
    return {ms: row.latency_bound_ms, text: "> " + row.latency_bound_ms.toFixed(1)};
  return {ms: null, text: "—"};
}

function percentile(q) {
  const known = frames.map(latency).filter((l) => l.ms != null).sort((a, b) => a.ms - b.ms);
  if (!known.length) return "—";
  return known[Math.min(known.length - 1, Math.floor(q * known.length))].text + " ms";
}

function draw() {
  drawPending = false;
  const last = frames[frames.length - 1];
  $("frames").textContent = frames.length;
  const box = $("words");
  box.textContent = words;
  box.scrollTop = box.scrollHeight;
  $("silent").textContent = frames.filter((r) => r.silent).length;
  $("last-latency").textContent = last ? latency(last).text + " ms" : "—";
  $("p50").textContent = percentile(0.5);
  $("p95").textContent = percentile(0.95);
  $("rows").innerHTML = frames.slice(-SHOWN_ROWS).reverse().map((r) =>
    `<tr class="${r.silent ? "silent" : ""}"><td>${r.frame_idx}</td><td>${latency(r).text}` +
    `</td><td>${r.tokens_out} / ${r.tokens_expected}</td><td>${r.on_time ? "yes" : "no"}</td>` +
    `<td>${r.silent ? "silent (" + (r.silent_cause || "?") + ")" : ""}</td></tr>`).join("");
  chart();
}

function chart() {
  const c = $("chart");
  const g = c.getContext("2d");
  const shown = frames.slice(-CHART_FRAMES);
  g.clearRect(0, 0, c.width, c.height);
  const top = Math.max(1.5 * (budgetMs || 0), ...shown.map((r) => latency(r).ms || 0), 1);
  const y = (ms) => c.height - (ms / top) * (c.height - 10);
  const w = c.width / CHART_FRAMES;
  shown.forEach((r, i) => {
    const ms = latency(r).ms;
    g.fillStyle = r.silent ? "#d33" : "#3a6ea5";
    // A silent frame with no latency still gets a full-height mark: it is the news.
    const h = ms == null ? c.height : c.height - y(ms);
    g.fillRect(i * w + 1, c.height - h, Math.max(1, w - 2), h);
  });
  if (budgetMs) {
    g.setLineDash([6, 4]);
    g.strokeStyle = "#444";
    g.beginPath();
    g.moveTo(0, y(budgetMs));
    g.lineTo(c.width, y(budgetMs));
    g.stroke();
    g.setLineDash([]);
    g.fillStyle = "#444";
    g.fillText(`budget ${budgetMs} ms`, 4, y(budgetMs) - 4);
  }
}

$("start").onclick = () => start().catch((err) => {
  say(`The page could not start: ${err.message}`, "error");
  if (mic) release();
  $("start").disabled = false;
});
$("stop").onclick = stop;
