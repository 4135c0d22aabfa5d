// The run watch page: renders a run's events as @runledger/client's stream delivers them — each
// once, in seq order, through any number of drops (runledger-client.js, the package's browser
// build: docs/design/clients.md#browser) — and sends its commands through the same client.
// A dropped connection is never a cancellation: only the cancel event (or a 409's committed run)
// changes what the page says about the run's end.
(() => {
  "use strict";
  const root = document.getElementById("watch");
  if (!root) return;
  const $ = (id) => document.getElementById(id);
  const runId = root.dataset.runId;
  // The types this page renders, by the server's names (runs.events.browser_vocabulary).
  const V = JSON.parse($("rl-event-vocabulary").textContent);
  const T = V.types;
  // The API is mounted where the stream's URL begins: "" on the standalone site, the host's prefix
  // where a project includes the app under one.
  const streamUrl = root.dataset.streamUrl;
  const client = new Runledger.Client({
    baseUrl: streamUrl.slice(0, streamUrl.lastIndexOf("/api/runs/")),
    // The token the page was rendered with, not the cookie's: it holds where a site makes the
    // cookie unreadable to scripts (CSRF_COOKIE_HTTPONLY) or keeps it in the session.
    csrfToken: root.dataset.csrfToken,
  });

  let ended = false;    // the terminal event has been rendered (or a 409 told the end)
  let stream = null;

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
      case T.STEP_COMPLETED:
        activity("Step " + d.name + " done", "step");
        break;
      case T.STEP_RETRYING:
        activity("Step " + d.name + " failed (" + d.error + ": " + d.message + "); retrying in " + Number(d.wait).toFixed(1) + " s", "retry");
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
    stream.close();
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
      const run = await client.runs.get(runId);
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
    } catch (err) { /* transient: try again below */ }
    setTimeout(() => pollReleased(Math.min(delayMs * 2, 5000)), delayMs);
  }

  function showConnection(connection) {
    switch (connection.state) {
      case "connecting":
        setConnection("connecting", "connecting…");
        break;
      case "live":
        setConnection("live", "live");
        break;
      case "reconnecting":
        setConnection("reconnecting", "reconnecting…");
        break;
      case "refused": // 401, 403, 404: retrying will not change it
        setConnection("refused", "refused: " + connection.reason);
        break;
      // "ended" is shown by finish(), once the terminal event is rendered.
    }
  }

  async function follow() {
    stream = client.runs.stream(runId, { onState: showConnection });
    // A network that came back, a tab woken from sleep: connect now, not at the end of a backoff,
    // and drop a connection the sleep left silent.
    Runledger.wakeOnReturn(stream);
    // A refusal is on the page already (showConnection).
    const connection = await stream.follow(render);
    // A run that ended before the cursor (the stream's 204): its end is read, not streamed.
    if (!ended && connection.state === "ended" && !connection.aborted) {
      const run = await client.runs.get(runId);
      finish(run.status, run.end_code);
    }
  }

  $("stop").addEventListener("click", async () => {
    $("stop").disabled = true;
    $("stop-state").textContent = "stopping…";
    try {
      await client.runs.cancel(runId);
      // Answered: stay "stopping…" until the cancel event arrives on the stream.
    } catch (error) {
      if (error instanceof Runledger.Conflict && error.run) {
        // The run ended otherwise before the cancel: show the committed truth.
        const status = error.run.status;
        if (!ended) finish(status, error.run.end_code);
        $("stop-state").textContent = "the run had already " + status;
      } else {
        $("stop").disabled = ended;
        $("stop-state").textContent =
          error instanceof Runledger.APIError
            ? "could not stop the run (HTTP " + error.status + ")"
            : "could not reach the server; try again";
      }
    }
  });

  $("resume-form").addEventListener("submit", async (submitEvent) => {
    submitEvent.preventDefault();
    $("resume").disabled = true;
    try {
      const run = await client.runs.get(runId);
      await client.runs.resume(runId, run.resume_ticket || "", $("resume-input").value);
      $("resume-form").hidden = true;
      $("resume-input").value = "";
    } catch (error) {
      activity("Resume refused: " + error.message, "error");
    } finally {
      $("resume").disabled = false;
    }
  });

  follow();
})();
