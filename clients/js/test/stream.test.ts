// runs.stream(): chosen types, the 204 at the end, the caller's AbortSignal, and the cases a real
// server never makes on demand (a gap, a replayed event, a silent connection) from a stand-in.
import assert from "node:assert/strict";
import { test } from "node:test";
import type { RunEvent } from "@runledger/client";
import { client, event, frame, gauge, standIn, storedLog, waitFor } from "./support.js";

test("a stream of chosen types is exactly those of the log, and the terminal event", { timeout: 30_000 }, async () => {
  const api = client();
  const run = await api.runs.wait((await api.runs.create("demo", { deltas: 4, delay_ms: 0 })).id);
  for (const types of [["output.delta"], ["run.*"], ["output.delta", "run.created"]]) {
    const streamed = [];
    for await (const e of api.runs.stream(run.id, { types })) streamed.push(e);
    assert.deepEqual(streamed, await storedLog(api, run.id, types));
    assert.equal(streamed.at(-1)?.type, "run.completed");
  }
  const deltas = await api.runs.stream(run.id, { types: "output.delta" }).text();
  assert.equal(deltas, (run.output as { text: string }).text);
});

test("a finished run read to its end answers 204: the stream ends, empty", { timeout: 30_000 }, async () => {
  const api = client();
  const run = await api.runs.wait((await api.runs.create("demo", { deltas: 3, delay_ms: 0 })).id);
  const empty = api.runs.stream(run.id, { afterSeq: run.last_seq });
  assert.equal(await empty.untilEnd(), null);
  assert.deepEqual(empty.connection, { state: "ended", status: null, aborted: false });
  const tail = api.runs.stream(run.id, { afterSeq: run.last_seq - 2 });
  const seqs = [];
  for await (const e of tail) seqs.push(e.seq);
  assert.deepEqual(seqs, [run.last_seq - 1, run.last_seq]);
  assert.deepEqual(tail.connection, { state: "ended", status: "completed", aborted: false });
  assert.equal(tail.terminal?.type, "run.completed");
});

test("aborting ends the iteration and closes the connection; the run goes on", { timeout: 60_000 }, async () => {
  const api = client();
  const before = await gauge("runledger_sse_streams_open");
  const run = await api.runs.create("demo", { deltas: 1000, delay_ms: 20 });
  const abort = new AbortController();
  const stream = api.runs.stream(run.id, { signal: abort.signal });
  const seen: number[] = [];
  for await (const e of stream) {
    seen.push(e.seq);
    if (e.seq === 5) {
      await waitFor(async () => (await gauge("runledger_sse_streams_open")) === before + 1, 10_000, "the stream open");
      abort.abort();
    }
  }
  assert.deepEqual(seen, [1, 2, 3, 4, 5]);
  assert.deepEqual(stream.connection, { state: "ended", status: null, aborted: true });
  await waitFor(async () => (await gauge("runledger_sse_streams_open")) === before, 10_000, "the stream closed");
  // A dropped connection is not a cancellation: the run writes on.
  const later = await waitFor(
    async () => {
      const now = await api.runs.get(run.id);
      return now.last_seq > 10 && now;
    },
    20_000,
    "the run to go on",
  );
  assert.equal(later.status, "running");

  // Leaving a `for await` (break) and close() close it the same way.
  for await (const e of api.runs.stream(run.id)) if (e.seq === 2) break;
  const closing = api.runs.stream(run.id);
  for await (const e of closing) if (e.seq === 2) closing.close();
  assert.equal(closing.state, "ended");
  await waitFor(async () => (await gauge("runledger_sse_streams_open")) === before, 10_000, "both closed");
  assert.equal((await api.runs.get(run.id)).status, "running");
  await api.runs.cancel(run.id);
});

test("a gap is filled from the events pages, a replayed seq dropped, the cursor resumed in the query", { timeout: 30_000 }, async () => {
  const log = [1, 2, 3, 4, 5, 6].map((seq) => event(seq, seq === 6 ? "run.completed" : "output.delta", { text: `${seq}` }));
  const server = await standIn((request, response) => {
    const url = new URL(request.url ?? "", "http://stand.in");
    const after = Number(url.searchParams.get("after_seq"));
    if (url.pathname.endsWith("/events/")) {
      const results = log.filter((e) => e.seq > after).slice(0, 1); // pages of one: read on
      const body = { results, next_after_seq: results.at(-1)?.seq ?? after, last_seq: 6, run_status: "completed", end_of_stream: false };
      response.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify(body));
      return;
    }
    response.writeHead(200, { "Content-Type": "text/event-stream" });
    response.write("retry: 10\n\n");
    if (after === 0) {
      // 1, 2, 2 again, then 5: 3 and 4 missing; then the connection drops mid-frame.
      const [one, two, , , five] = log as [RunEvent, RunEvent, RunEvent, RunEvent, RunEvent];
      const cut = frame(log[5] as RunEvent).slice(0, 20);
      response.write(frame(one) + frame(two) + frame(two) + frame(five) + cut, () => response.destroy());
    } else {
      response.end(log.filter((e) => e.seq > after).map(frame).join(""));
    }
  });
  try {
    const api = client({ baseUrl: server.url });
    const seqs = [];
    for await (const e of api.runs.stream("r1")) seqs.push(e.seq);
    assert.deepEqual(seqs, [1, 2, 3, 4, 5, 6]);
    const asked = server.requests.map((request) => request.url);
    assert.deepEqual(asked, [
      "/api/runs/r1/stream/?after_seq=0",
      "/api/runs/r1/events/?after_seq=2&limit=1000",
      "/api/runs/r1/events/?after_seq=3&limit=1000",
      "/api/runs/r1/stream/?after_seq=5",
    ]);
  } finally {
    await server.close();
  }
});

test("a stream silent past streamTimeoutMs counts as dropped and reconnects", { timeout: 30_000 }, async () => {
  let connects = 0;
  const server = await standIn((_request, response) => {
    connects += 1;
    response.writeHead(200, { "Content-Type": "text/event-stream" });
    if (connects === 1) response.write(frame(event(1, "run.created")));
    else response.end(frame(event(2, "run.completed")));
  });
  try {
    const states: string[] = [];
    const api = client({ baseUrl: server.url, streamTimeoutMs: 300 });
    const stream = api.runs.stream("r2", { onState: (c) => states.push(c.state) });
    const seqs = [];
    for await (const e of stream) seqs.push(e.seq);
    assert.deepEqual([seqs, connects], [[1, 2], 2]);
    assert.deepEqual(states, ["connecting", "live", "reconnecting", "live", "ended"]);
  } finally {
    await server.close();
  }
});

test("with a finite streamAttempts, a server that keeps refusing for now ends it refused", { timeout: 30_000 }, async () => {
  const server = await standIn((_request, response) => {
    const body = JSON.stringify({ error: { code: "too_many_requests", message: "streams cap", detail: null } });
    response.writeHead(429, { "Content-Type": "application/json", "Retry-After": "0" }).end(body);
  });
  try {
    const api = client({ baseUrl: server.url, retry: { baseMs: 5, capMs: 20, streamAttempts: 3 } });
    const stream = api.runs.stream("r3");
    await assert.rejects(stream.untilEnd(), { name: "TooManyRequests" });
    assert.deepEqual([stream.state, server.requests.length], ["refused", 3]);
  } finally {
    await server.close();
  }
});

test("follow() hands over each event and answers a refusal, not throwing it; another error is thrown", { timeout: 30_000 }, async () => {
  const api = client();
  const run = await api.runs.wait((await api.runs.create("demo", { deltas: 3, delay_ms: 0 })).id);
  const seen: number[] = [];
  const ended = await api.runs.stream(run.id).follow((e) => seen.push(e.seq));
  assert.deepEqual(ended, { state: "ended", status: "completed", aborted: false });
  assert.deepEqual(seen, await storedLog(api, run.id).then((log) => log.map((e) => e.seq)));
  const refused = await client({ token: "not-a-token" }).runs.stream(run.id).follow(() => assert.fail("no event"));
  assert.equal(refused.state, "refused");
  const failing = api.runs.stream(run.id);
  await assert.rejects(
    failing.follow(() => {
      throw new Error("the page's own");
    }),
    { message: "the page's own" },
  );
});
