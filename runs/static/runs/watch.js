// The run watch page: renders a run's events from its SSE stream and sends its commands.
// A dropped connection is never a cancellation: only run.cancelled (or a 409's committed run)
// changes what the page says about the run's end.
(() => {
  "use strict";
  const root = document.getElementById("watch");
  if (!root) return;
  const $ = (id) => document.getElementById(id);
  const streamUrl = root.dataset.streamUrl;
  const runUrl = root.dataset.runUrl;
  const csrf = root.dataset.csrfToken;
  const TERMINAL = { "run.completed": "completed", "run.failed": "failed", "run.cancelled": "cancelled", "run.stopped": "stopped" };
  const TYPES = ["run.created", "run.started", "output.delta", "tool.started", "tool.finished", "run.waiting",
    "run.resumed", "run.requeued", ...Object.keys(TERMINAL)];

  let lastSeq = 0;      // the highest seq rendered: the dedup guard and the resume cursor
  let ended = false;    // the terminal event has been rendered
  let source = null;
  let retryTimer = null;

  function setConnection(state, text) {
    const el = $("connection");
    el.className = "conn conn-" + state;
    el.textContent = text;
    root.dataset.connection = state;
  }

  function setStatus(status) {
    const el = $("status");
    el.className = "badge status-" + status;
    el.textContent = status;
    root.dataset.status = status;
  }

  function activity(text, cls) {
    const li = document.createElement("li");
    if (cls) li.className = cls;
    li.textContent = text;
    $("activity").appendChild(li);
  }

  function render(event) {
    const d = event.data || {};
    switch (event.type) {
      case "output.delta":
        $("output").appendChild(document.createTextNode(d.text || ""));
        break;
      case "run.created":
        activity("Created");
        break;
      case "run.started":
        setStatus("running");
        activity("Started (attempt " + d.generation + " on " + d.worker + ")");
        break;
      case "tool.started":
        activity("Tool " + d.name + " started", "tool");
        break;
      case "tool.finished":
        activity("Tool " + d.name + " finished" + (d.error ? " with an error" : ""), "tool");
        break;
      case "run.waiting":
        setStatus("waiting");
        activity(d.reason === "paused" ? "Paused" : "Waiting for input");
        $("prompt").textContent = d.prompt || "The run is paused. Send anything to resume it.";
        $("resume-form").hidden = false;
        break;
      case "run.resumed":
        setStatus("queued");
        activity("Resumed" + (d.input !== null && d.input !== undefined && d.input !== "" ? " with " + JSON.stringify(d.input) : ""));
        $("resume-form").hidden = true;
        break;
      case "run.requeued":
        setStatus("queued");
        activity("Requeued (" + d.cause + ")");
        break;
      default:
        if (TERMINAL[event.type]) {
          const why = d.reason || d.note || "";
          activity(TERMINAL[event.type][0].toUpperCase() + TERMINAL[event.type].slice(1) + (why ? ": " + why : ""));
          finish(TERMINAL[event.type], d.code || "");
        }
    }
  }

  function onEvent(message) {
    const seq = Number(message.lastEventId);
    if (!(seq > lastSeq)) return; // already rendered: a reconnect never doubles anything
    lastSeq = seq;
    root.dataset.lastSeq = String(lastSeq);
    render(JSON.parse(message.data));
  }

  function finish(status, code) {
    ended = true;
    setStatus(status);
    $("ended").textContent = code ? status + " (" + code + ")" : status;
    $("stop").disabled = true;
    $("stop-state").textContent = status === "cancelled" ? "cancelled" : "";
    $("resume-form").hidden = true;
    if (source) source.close();
    setConnection("ended", "ended");
    pollReleased(40);
  }

  // Nothing follows the terminal event; "the work has stopped" is the attempt's released_at.
  async function pollReleased(triesLeft) {
    try {
      const response = await fetch(runUrl, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (response.ok) {
        const run = await response.json();
        if (!run.attempt) {
          $("released").textContent = "no worker held it";
          return;
        }
        if (run.attempt.released_at) {
          $("released").textContent = "released at " + run.attempt.released_at;
          root.dataset.released = "yes";
          return;
        }
      }
    } catch (err) { /* transient: try again below */ }
    if (triesLeft > 1) setTimeout(() => pollReleased(triesLeft - 1), 250);
    else $("released").textContent = "not yet";
  }

  function connect() {
    clearTimeout(retryTimer);
    // EventSource itself resends Last-Event-ID on its own reconnects; after_seq covers the
    // reconnects this page makes when the browser has given up (e.g. after an HTTP error).
    source = new EventSource(streamUrl + "?after_seq=" + lastSeq);
    source.onopen = () => setConnection("live", "live");
    source.onmessage = onEvent;
    TYPES.forEach((type) => source.addEventListener(type, onEvent));
    source.onerror = () => {
      if (ended) return;
      if (source.readyState === EventSource.CLOSED) {
        setConnection("reconnecting", "reconnecting…");
        retryTimer = setTimeout(connect, 2000);
      } else {
        setConnection("reconnecting", "reconnecting…");
      }
    };
  }

  function post(path, body) {
    return fetch(runUrl + path, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": csrf },
      body: JSON.stringify(body || {}),
    });
  }

  $("stop").addEventListener("click", async () => {
    $("stop").disabled = true;
    $("stop-state").textContent = "stopping…";
    try {
      const response = await post("cancel/");
      if (response.status === 409) {
        // The run ended otherwise before the cancel: show the committed truth.
        const body = await response.json();
        const status = body.run ? body.run.status : "ended";
        if (!ended) finish(status, body.run ? body.run.end_code : "");
        $("stop-state").textContent = "the run had already " + status;
      } else if (!response.ok) {
        $("stop").disabled = ended;
        $("stop-state").textContent = "could not stop the run (HTTP " + response.status + ")";
      }
      // 200: stay "stopping…" until run.cancelled arrives on the stream.
    } catch (err) {
      $("stop").disabled = ended;
      $("stop-state").textContent = "could not reach the server; try again";
    }
  });

  $("resume-form").addEventListener("submit", async (submitEvent) => {
    submitEvent.preventDefault();
    $("resume").disabled = true;
    try {
      const run = await (await fetch(runUrl, { credentials: "same-origin" })).json();
      const response = await post("resume/", { ticket: run.resume_ticket || "", input: $("resume-input").value });
      if (!response.ok) {
        const body = await response.json();
        activity("Resume refused: " + (body.error ? body.error.message : response.status), "error");
      } else {
        $("resume-form").hidden = true;
        $("resume-input").value = "";
      }
    } finally {
      $("resume").disabled = false;
    }
  });

  connect();
})();
