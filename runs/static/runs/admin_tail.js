// Live tail of a run's events on its admin page, over @runledger/client's stream
// (runledger-client.js, the package's browser build: docs/design/clients.md#browser).
//
// The page renders the newest events and the seq of the last one; the stream goes on from that
// seq and delivers each later event once, in seq order, through any number of drops, and this
// appends each as a row, until the run's terminal event. A stream the server refuses (the staff
// member signed out, the run gone) says why and stops.
"use strict";
(function () {
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

  async function start(tail) {
    const body = document.getElementById("rl-events-body");
    const status = document.getElementById("rl-tail-status");

    function setStatus(text, state) {
      status.textContent = text;
      status.className = "rl-tail-" + state;
    }

    function append(event) {
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
      const counter = document.getElementById("rl-last-seq");
      if (counter) counter.textContent = String(event.seq);
    }

    function finish(finalStatus) {
      setStatus("ended: the run is " + finalStatus, "ended");
      document.querySelectorAll("[data-rl-run-status]").forEach((badge) => {
        badge.textContent = finalStatus;
        badge.className = "rl-badge rl-status-" + finalStatus;
      });
      document.querySelectorAll(".rl-live-only").forEach((element) => element.remove());
      refreshFacts(250, 40);
    }

    // The page's facts (title, fields, attempts) as the server renders them now that the run has
    // ended, and again until the worker's release is recorded: no reload, and the tail stays.
    // Disjoint: the attempts' inline holds a fieldset of its own, which goes with its group.
    const FACTS = [
      "#content > h1",
      "#content > h2",
      ".breadcrumbs",
      "#run_form fieldset:not(.inline-group fieldset)",
      "#run_form .inline-group",
    ];
    async function refreshFacts(delayMs, triesLeft) {
      let settled = false;
      try {
        const response = await fetch(window.location.href, { credentials: "same-origin" });
        if (response.ok) {
          const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
          FACTS.forEach((selector) => {
            const now = document.querySelectorAll(selector);
            const then = fresh.querySelectorAll(selector);
            if (now.length === then.length) now.forEach((element, i) => element.replaceWith(then[i]));
          });
          settled = !fresh.body.textContent.includes("not released yet");
          document.body.dataset.rlFacts = settled ? "final" : "ended";
        }
      } catch (error) { /* transient: try again below */ }
      if (!settled && triesLeft > 1) setTimeout(() => refreshFacts(Math.min(delayMs * 2, 5000), triesLeft - 1), delayMs);
    }

    function showConnection(connection) {
      if (connection.state === "live") setStatus("live", "live");
      else if (connection.state === "reconnecting") setStatus("reconnecting…", "trouble");
      else if (connection.state === "refused") setStatus("refused: " + connection.reason, "trouble");
    }

    // The API is mounted where the stream's URL begins ("" or the host's prefix).
    const streamUrl = tail.dataset.streamUrl;
    const client = new Runledger.Client({ baseUrl: streamUrl.slice(0, streamUrl.lastIndexOf("/api/runs/")) });
    const runId = tail.dataset.runId;
    const stream = client.runs.stream(runId, {
      afterSeq: parseInt(tail.dataset.afterSeq, 10),
      onState: showConnection,
    });
    // A tab woken from sleep, a network that came back: connect now, not after a backoff.
    Runledger.wakeOnReturn(stream);
    // A refusal is on the page already (showConnection). After the terminal event's row; a run
    // ended before the page's last row (the stream's 204) has its end read.
    const connection = await stream.follow(append);
    if (connection.state === "ended" && !connection.aborted) {
      finish(connection.status || (await client.runs.get(runId)).status);
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    const tail = document.getElementById("rl-live-tail");
    if (tail) start(tail);
  });
})();
