// Live tail of a run's events on its admin page, over the shared stream client (stream.js).
//
// The page renders the newest events and the seq of the last one; the client streams from that
// seq and delivers each later event once, in seq order (filling gaps from the admin's events JSON
// view, a bounded page at a time, as the API's: docs/design/fair-use.md#bounded-answers), and this
// appends each as a row. When the browser gives up on the stream the tail says
// so rather than retrying: a staff page is reloaded by its reader.
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

  function start(tail) {
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

    RunledgerStream.open({
      streamUrl: tail.dataset.streamUrl,
      eventsUrl: tail.dataset.eventsUrl,
      afterSeq: parseInt(tail.dataset.afterSeq, 10),
      onEvent: append,
      onState: (state, detail) => {
        if (state === "live") setStatus("live", "live");
        else if (state === "reconnecting") setStatus("reconnecting…", "trouble");
        else if (state === "disconnected") setStatus("disconnected (reload the page)", "trouble");
        else if (state === "trouble") setStatus("error: " + detail.message + " (reload the page)", "trouble");
        else if (state === "stopped") setStatus("stopped: " + detail, "trouble");
        else if (state === "ended") finish(detail);
      },
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    const tail = document.getElementById("rl-live-tail");
    if (tail) start(tail);
  });
})();
