// Live tail of a run's events on its admin page, over the SSE stream of DESIGN §5.
//
// The page renders the newest events and the seq of the last one; this opens
// /api/runs/<id>/stream/?after_seq=<that seq> and appends each event as a row. EventSource sends
// Last-Event-ID itself when it reconnects, so a dropped connection loses nothing. Named SSE events
// only reach listeners registered for their type, so rows of a type not listed in
// data-event-types appear when the next listed one reveals the gap in seq: the missing events are
// then read from the admin's events JSON view. The stream ends after the run's terminal event.
"use strict";
(function () {
  const TERMINAL = {
    "run.completed": "completed",
    "run.failed": "failed",
    "run.cancelled": "cancelled",
    "run.stopped": "stopped",
  };

  // The same text as runs.admin.event_summary renders on the server.
  function summary(data) {
    if (data === null || typeof data !== "object" || Array.isArray(data)) {
      return JSON.stringify(data);
    }
    return Object.keys(data)
      .sort()
      .map((key) => {
        const value = data[key];
        return key + ": " + (typeof value === "string" ? value : JSON.stringify(value));
      })
      .join(" · ");
  }

  // The same text as runs.admin.event_time: UTC to the millisecond.
  function time(iso) {
    return new Date(iso).toISOString().slice(0, 23).replace("T", " ");
  }

  function cell(row, text, className) {
    const td = document.createElement("td");
    if (className) td.className = className;
    td.textContent = text;
    row.appendChild(td);
    return td;
  }

  function start(tail) {
    const body = document.getElementById("rl-events-body");
    const status = document.getElementById("rl-tail-status");
    const eventsUrl = tail.dataset.eventsUrl;
    let lastSeq = parseInt(tail.dataset.afterSeq, 10);
    let ended = false;
    let queue = Promise.resolve();

    function setStatus(text, state) {
      status.textContent = text;
      status.className = "rl-tail-" + state;
    }

    function append(event) {
      if (event.seq <= lastSeq) return; // already shown (a replay after a reconnect)
      const row = document.createElement("tr");
      row.dataset.seq = String(event.seq);
      row.className = "rl-new";
      cell(row, String(event.seq), "rl-seq");
      cell(row, event.type, "rl-type");
      cell(row, time(event.created_at), "rl-time");
      cell(row, event.attempt === null ? "—" : String(event.attempt), "rl-attempt");
      const data = document.createElement("div");
      data.className = "rl-data";
      data.textContent = summary(event.data);
      row.appendChild(document.createElement("td")).appendChild(data);
      body.appendChild(row);
      const none = document.getElementById("rl-no-events");
      if (none) none.remove();
      lastSeq = event.seq;
      const counter = document.getElementById("rl-last-seq");
      if (counter) counter.textContent = String(lastSeq);
      if (TERMINAL[event.type]) finish(TERMINAL[event.type]);
    }

    async function fillGap() {
      const response = await fetch(eventsUrl + "?after_seq=" + lastSeq, { credentials: "same-origin" });
      if (!response.ok) throw new Error("events view answered " + response.status);
      (await response.json()).results.forEach(append);
    }

    async function handle(event) {
      if (event.seq > lastSeq + 1) await fillGap();
      append(event);
    }

    function finish(finalStatus) {
      ended = true;
      source.close();
      setStatus("ended: the run is " + finalStatus, "ended");
      document.querySelectorAll("[data-rl-run-status]").forEach((badge) => {
        badge.textContent = finalStatus;
        badge.className = "rl-badge rl-status-" + finalStatus;
      });
      document.querySelectorAll(".rl-live-only").forEach((element) => element.remove());
    }

    const source = new EventSource(tail.dataset.streamUrl + "?after_seq=" + lastSeq);
    JSON.parse(tail.dataset.eventTypes).forEach((type) => {
      source.addEventListener(type, (message) => {
        const event = JSON.parse(message.data);
        // One at a time, in arrival order, even while a gap is being filled.
        queue = queue.then(() => (ended ? undefined : handle(event))).catch((error) => {
          setStatus("error: " + error.message + " (reload the page)", "trouble");
        });
      });
    });
    source.addEventListener("open", () => setStatus("live", "live"));
    source.addEventListener("error", () => {
      if (ended) return;
      if (source.readyState === EventSource.CLOSED) {
        setStatus("disconnected (reload the page)", "trouble");
      } else {
        setStatus("reconnecting…", "trouble");
      }
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    const tail = document.getElementById("rl-live-tail");
    if (tail) start(tail);
  });
})();
