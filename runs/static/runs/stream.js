// The one browser stream client (docs/design/clients.md#browser), shared by the watch page and the
// staff console's live tail: a run's events from its SSE stream
// (docs/design/streaming.md#guarantees), each delivered once, in seq order.
//
//   const client = RunledgerStream.open({
//     streamUrl: "/api/runs/<id>/stream/",  // opened with ?after_seq=<cursor>
//     eventsUrl: "/api/runs/<id>/events/",  // JSON pages (docs/design/streaming.md#json-pages) read to fill gaps
//     afterSeq: 0,                          // the last seq the page already shows
//     types: ["output.delta", "run.*"],     // optional: only these (and the terminal event)
//     vocabulary: V,                        // default: RunledgerStream.vocabulary()
//     retryClosedMs: 2000,                  // see below; null (default): report "disconnected"
//     onEvent: (event) => {},               // {seq, type, data, created_at, attempt}
//     onState: (state, detail) => {},       // see below
//   });
//   client.lastSeq; client.close();
//
// States: "connecting" (once, at open), "live" (the stream is open), "reconnecting" (EventSource
// retries by itself, or the client does after retryClosedMs), "disconnected" (the browser gave up
// and retryClosedMs is null), "trouble" (detail: the Error of a failed gap fill; the next event
// tries again), "stopped" (detail: why — the server answered 401, 403 or 404; no retry),
// "ended" (detail: the final status, after the terminal event was delivered).
// After close(), "stopped" or "ended" no callback is made.
//
// Why each part:
// - EventSource hands a named event only to a listener for that name, with no wildcard: the
//   client listens for every type of the server's vocabulary (runs.events.browser_vocabulary,
//   rendered by the page as a JSON script tag) and for unnamed messages. A type an agent declared
//   still arrives unheard; seq is gap-free (docs/design/events.md#seq), so the next event shows the
//   gap and the missing events are read from the events JSON before it is delivered.
// - seq <= the last delivered one is a replay after a reconnect: dropped.
// - Events are handled one at a time in arrival order, so none overtakes a gap being filled.
// - Nothing follows the terminal event; the client closes the stream after it, or EventSource
//   would reconnect and be answered 204.
// - EventSource resends Last-Event-ID on its own reconnects; once it has given up
//   (readyState CLOSED, e.g. after an HTTP error) only a new EventSource retries, and its cursor
//   is ?after_seq=<last delivered seq>.
// - With `types` (docs/design/streaming.md#types) the stream and the pages carry only those: seq
//   then has gaps of its own, so none is filled; an event the page could not hear is one of a type
//   its agent never declared, which a worker refuses.
// - EventSource never tells why it gave up. The client asks the events JSON (the same cursor):
//   401, 403 and 404 will not change by retrying, so it stops and says why ("stopped"); pages
//   read on from `next_after_seq` (each is bounded) that reach the end of a finished run (the
//   stream's 204) end it; anything else is retried.
"use strict";
window.RunledgerStream = (function () {
  function vocabulary(elementId) {
    const element = document.getElementById(elementId || "rl-event-vocabulary");
    if (!element) throw new Error("no event vocabulary on this page (#" + (elementId || "rl-event-vocabulary") + ")");
    return JSON.parse(element.textContent);
  }

  function open(options) {
    const V = options.vocabulary || vocabulary();
    const types = options.types ? [].concat(options.types).join(",") : null;
    function afterSeq(url, seq) {
      const query = "after_seq=" + seq + (types ? "&types=" + encodeURIComponent(types) : "");
      return url + (url.indexOf("?") === -1 ? "?" : "&") + query;
    }
    const onEvent = options.onEvent;
    const onState = options.onState || function () {};
    const retryClosedMs = options.retryClosedMs === undefined ? null : options.retryClosedMs;
    let lastSeq = options.afterSeq || 0;
    let done = false; // ended or closed: nothing more is delivered or reported
    let source = null;
    let retryTimer = null;
    let queue = Promise.resolve();

    function report(state, detail) {
      if (!done) onState(state, detail);
    }

    function close() {
      done = true;
      clearTimeout(retryTimer);
      if (source) source.close();
    }

    function deliver(event) {
      if (done || event.seq <= lastSeq) return;
      lastSeq = event.seq;
      onEvent(event);
      const finalStatus = V.terminal[event.type];
      if (finalStatus !== undefined && !done) {
        close();
        onState("ended", finalStatus);
      }
    }

    // Reads pages after the last delivered seq until the event before `seq` is delivered.
    async function fillGap(seq) {
      while (!done && lastSeq < seq - 1) {
        const before = lastSeq;
        const response = await fetch(afterSeq(options.eventsUrl, before), {
          credentials: "same-origin",
          headers: { Accept: "application/json" },
        });
        if (!response.ok) throw new Error("events view answered " + response.status);
        (await response.json()).results.forEach(deliver);
        if (!done && lastSeq === before) throw new Error("events view has nothing after seq " + before);
      }
    }

    function arrive(message) {
      queue = queue
        .then(async () => {
          if (done) return;
          const event = JSON.parse(message.data);
          if (event.seq > lastSeq + 1 && !types) await fillGap(event.seq);
          deliver(event);
        })
        .catch((error) => report("trouble", error));
    }

    const REFUSALS = { 401: "not signed in (401)", 403: "not allowed (403)", 404: "no such run (404)" };

    // The stream gave up: learn why from the events JSON, deliver what it holds, then go on.
    async function whyClosed() {
      async function page() {
        try {
          return await fetch(afterSeq(options.eventsUrl, lastSeq), {
            credentials: "same-origin",
            headers: { Accept: "application/json" },
          });
        } catch (error) {
          return null; // unreachable: retried like any other failure
        }
      }
      let response = await page();
      if (done) return;
      if (response && REFUSALS[response.status]) {
        const why = REFUSALS[response.status];
        close();
        onState("stopped", why);
        return;
      }
      // A page is bounded (a count, and bytes): read on while one ends short of what is stored.
      while (response && response.ok) {
        const body = await response.json();
        body.results.forEach(deliver);
        if (done) return;
        if (body.end_of_stream) {
          close();
          onState("ended", body.run_status);
          return;
        }
        if (!body.results.length || body.next_after_seq >= body.last_seq) break;
        response = await page();
        if (done) return;
      }
      if (retryClosedMs === null) {
        report("disconnected");
      } else {
        report("reconnecting");
        retryTimer = setTimeout(connect, retryClosedMs);
      }
    }

    function connect() {
      retryTimer = null;
      const es = new EventSource(afterSeq(options.streamUrl, lastSeq));
      source = es;
      es.onopen = () => report("live");
      es.onmessage = arrive;
      // EventSource delivers a named event only to listeners of its name: the agent's own types too.
      Object.values(V.types).concat(V.declared || []).forEach((type) => es.addEventListener(type, arrive));
      es.onerror = () => {
        if (done) return;
        if (es.readyState !== EventSource.CLOSED) {
          report("reconnecting");
        } else {
          // After any event still being handled, so the cursor asked about is the last delivered.
          queue = queue.then(whyClosed).catch((error) => report("trouble", error));
        }
      };
    }

    report("connecting");
    connect();
    return {
      close: close,
      get lastSeq() {
        return lastSeq;
      },
    };
  }

  return { open: open, vocabulary: vocabulary };
})();
