// The run watch page: renders a run's events, delivered once and in seq order by the shared
// stream client (stream.js), and sends its commands.
// A dropped connection is never a cancellation: only the cancel event (or a 409's committed run)
// changes what the page says about the run's end.
(() => {
  "use strict";
  const root = document.getElementById("watch");
  if (!root) return;
  const $ = (id) => document.getElementById(id);
  const runUrl = root.dataset.runUrl;
  const csrf = root.dataset.csrfToken;
  const V = RunledgerStream.vocabulary();
  const T = V.types;

  let ended = false;    // the terminal event has been rendered (or a 409 told the end)
  let client = null;

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
    // Each event advances the cursor, even one of an agent's own types this page does not show.
    root.dataset.lastSeq = String(event.seq);
    const d = event.data || {};
    switch (event.type) {
      case T.OUTPUT_DELTA:
        $("output").appendChild(document.createTextNode(d.text || ""));
        break;
      case T.RUN_CREATED:
        activity("Created");
        break;
      case T.RUN_STARTED:
        setStatus("running");
        activity("Started (attempt " + d.generation + " on " + d.worker + ")");
        break;
      case T.TOOL_STARTED:
        activity("Tool " + d.name + " started", "tool");
        break;
      case T.TOOL_FINISHED:
        if (d.status === V.toolStatuses.INTERRUPTED) activity("Tool " + d.name + " interrupted", "tool");
        else activity("Tool " + d.name + " finished" + (d.status === V.toolStatuses.ERROR ? " with an error" : ""), "tool");
        break;
      case T.CHILD_SPAWNED:
        activity("Child run " + String(d.run_id || "").slice(0, 8) + " started", "child");
        break;
      case T.RUN_WAITING:
        setStatus("waiting");
        activity(d.reason === V.waitReasons.PAUSED ? "Paused" : "Waiting for input");
        $("prompt").textContent = d.prompt || "The run is paused. Send anything to resume it.";
        $("resume-form").hidden = false;
        break;
      case T.RUN_RESUMED:
        setStatus("queued");
        activity("Resumed" + (d.input !== null && d.input !== undefined && d.input !== "" ? " with " + JSON.stringify(d.input) : ""));
        $("resume-form").hidden = true;
        break;
      case T.RUN_REQUEUED:
        setStatus("queued");
        activity("Requeued (" + d.cause + ")");
        break;
      default:
        if (V.declared.includes(event.type)) activity(event.type, "custom");
        if (V.terminal[event.type]) {
          const status = V.terminal[event.type];
          const why = d.reason || d.note || "";
          activity(status[0].toUpperCase() + status.slice(1) + (why ? ": " + why : ""));
          finish(status, d.code || "");
        }
    }
  }

  function finish(status, code) {
    ended = true;
    setStatus(status);
    $("ended").textContent = code ? status + " (" + code + ")" : status;
    $("stop").disabled = true;
    const cancelled = V.terminal[T.RUN_CANCELLED];
    $("stop-state").textContent = status === cancelled ? cancelled : "";
    $("resume-form").hidden = true;
    if (client) client.close();
    setConnection("ended", "ended");
    pollReleased(250);
  }

  // The run's final facts, as the server committed them.
  function showEnd(run) {
    if (!run.ended_at) return;
    $("ended").textContent = run.status + (run.end_code ? " (" + run.end_code + ")" : "") + " at " + run.ended_at;
    const result = run.status === V.terminal[T.RUN_FAILED] ? run.error : run.output;
    $("result").textContent = result === null || result === undefined ? "—" : JSON.stringify(result);
  }

  // Nothing follows the terminal event; "the work has stopped" is the attempt's released_at. A
  // live worker records it within its cancel grace; for a dead one the sweeper records when its
  // lease lapsed, so the page keeps asking, less and less often, until one of them has.
  async function pollReleased(delayMs) {
    try {
      const response = await fetch(runUrl, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (response.ok) {
        const run = await response.json();
        showEnd(run);
        const attempt = run.attempt;
        if (!attempt) {
          $("released").textContent = "no worker held it";
          return;
        }
        if (attempt.released_at) {
          const lost = attempt.outcome === "lost" ? " (its worker was lost; its lease lapsed then)" : "";
          $("released").textContent = "released at " + attempt.released_at + lost;
          root.dataset.released = "yes";
          return;
        }
        $("released").textContent = "not yet (the worker's lease lapses at " + attempt.lease_expires_at + ")";
      }
    } catch (err) { /* transient: try again below */ }
    setTimeout(() => pollReleased(Math.min(delayMs * 2, 5000)), delayMs);
  }

  function connect() {
    client = RunledgerStream.open({
      vocabulary: V,
      streamUrl: root.dataset.streamUrl,
      eventsUrl: root.dataset.eventsUrl,
      afterSeq: 0,
      // When the browser has given up (e.g. after an HTTP error), try again from the last event.
      retryClosedMs: 2000,
      onEvent: render,
      onState: (state, detail) => {
        if (state === "live") setConnection("live", "live");
        else if (state === "reconnecting") setConnection("reconnecting", "reconnecting…");
        else if (state === "trouble") setConnection("trouble", "trouble: " + detail.message);
        else if (state === "ended") setConnection("ended", "ended");
        else if (state === "stopped") setConnection("stopped", "stopped: " + detail);
      },
    });
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
      // 200: stay "stopping…" until the cancel event arrives on the stream.
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
