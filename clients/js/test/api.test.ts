// Every method of the client against a live Runledger, and every typed error it throws.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";
import {
  APIError,
  AuthenticationError,
  Conflict,
  ConnectionError,
  DatabaseUnavailable,
  IdempotencyMismatch,
  InvalidTransition,
  NotFound,
  PermissionDenied,
  StaleTicket,
  TooManyRequests,
  ValidationError,
} from "@runledger/client";
import { client, env, FAST, standIn, waitFor } from "./support.js";

const LONG = { deltas: 1000, delay_ms: 50 };
const staff = () => client({ token: env("RUNLEDGER_STAFF_TOKEN") });

async function raised<E extends APIError>(cls: new (...args: never[]) => E, call: () => Promise<unknown>): Promise<E> {
  try {
    await call();
  } catch (error) {
    assert.equal((error as Error).constructor, cls, `${String(error)} is not a ${cls.name}`);
    return error as E;
  }
  assert.fail(`no ${cls.name}`);
}

test("every method of runs and agents answers what the schema says", { timeout: 60_000 }, async () => {
  const api = staff();
  const agents = await api.agents.list().toArray();
  assert.ok(agents.some((agent) => agent.name === "demo"));
  const demo = (await api.agents.list({ pageSize: 1 }).toArray()).find((agent) => agent.name === "demo");
  assert.ok(demo && Array.isArray(demo.event_types));

  const batch = randomUUID();
  const run = await api.runs.create("demo", { deltas: 3, delay_ms: 0 }, { metadata: { batch } });
  assert.deepEqual([run.agent, run.status, run.metadata], ["demo", "queued", { batch }]);
  const done = await api.runs.wait(run.id);
  assert.equal(done.status, "completed");
  assert.deepEqual(done.output, { text: "chunk 0 chunk 1 chunk 2 ", deltas: 3 });
  const read = await api.runs.get(run.id);
  assert.equal(read.last_seq, done.last_seq);
  assert.ok(read.attempt !== null && read.attempt.generation >= 1);
  const page = await api.runs.events(run.id, { limit: 2 });
  assert.deepEqual(
    page.results.map((e) => e.seq),
    [1, 2],
  );
  assert.equal(page.end_of_stream, false);
  const listed = await api.runs.list({ metadata: { batch }, status: ["completed"] }).toArray();
  assert.deepEqual(
    listed.map((r) => r.id),
    [run.id],
  );
  assert.deepEqual(await api.runs.list({ metadata: { batch }, status: "queued" }).toArray(), []);

  const again = await api.runs.rerun(run.id, { input: { deltas: 2, delay_ms: 0 }, maxSteps: 9 });
  assert.deepEqual([again.rerun_of, again.input, again.max_steps], [run.id, { deltas: 2, delay_ms: 0 }, 9]);
  const fork = await api.runs.rerun(run.id, { fromSeq: 4 });
  assert.deepEqual((await api.runs.wait(fork.id)).output, done.output);

  const later = new Date(Date.now() + 3_600_000);
  const scheduled = await api.runs.create("demo", { deltas: 1 }, { priority: 7, startAfter: later });
  assert.deepEqual([scheduled.priority, Date.parse(scheduled.start_after ?? "")], [7, later.getTime()]);
  assert.equal((await api.runs.cancel(scheduled.id, { note: "not needed" })).status, "cancelled");
  // A cancel of a cancelled run is a success, not an error.
  assert.equal((await api.runs.cancel(scheduled.id)).status, "cancelled");

  const long = await api.runs.create("demo", LONG);
  assert.ok(["waiting", "running"].includes((await api.runs.pause(long.id)).status));
  assert.equal((await api.runs.cancel(long.id)).status, "cancelled");
  const stopped = await api.runs.create("demo", LONG);
  const stop = await api.runs.stop(stopped.id, "enough", { code: "policy" });
  assert.deepEqual([stop.status, stop.end_code], ["stopped", "policy"]);
  const released = await api.runs.wait(stopped.id, { released: true, timeoutMs: 30_000 });
  assert.ok(released.attempt === null || released.attempt.released_at !== null);
});

test("wait follows a run that asks, through its resume, to its end", { timeout: 60_000 }, async () => {
  const api = client();
  const asked = await api.runs.create("demo", { deltas: 2, delay_ms: 0, ask: "name?" });
  const ended = api.runs.wait(asked.id, { timeoutMs: 30_000 });
  const waiting = await waitFor(
    async () => {
      const run = await api.runs.get(asked.id);
      return run.status === "waiting" && run;
    },
    30_000,
    "the run to ask",
  );
  assert.ok(waiting.resume_ticket);
  assert.equal((await api.runs.resume(asked.id, waiting.resume_ticket, { name: "Ada" })).status, "queued");
  // Retried after a lost answer, the same resume is answered again and changes nothing.
  await api.runs.resume(asked.id, waiting.resume_ticket, { name: "Ada" });
  const run = await ended;
  assert.equal(run.status, "completed");
  assert.deepEqual((run.output as { answer: unknown }).answer, { name: "Ada" });
  const stale = await raised(StaleTicket, () => api.runs.resume(asked.id, "not-the-ticket"));
  assert.ok(stale instanceof Conflict);
});

test("every error code the server sends is its class", { timeout: 60_000 }, async () => {
  const api = client();
  const run = await api.runs.wait((await api.runs.create("demo", { deltas: 1, delay_ms: 0 })).id);

  const refused = await raised(ValidationError, () => api.runs.create("no-such-agent"));
  assert.equal(refused.status, 400);
  assert.ok(refused.fields["agent"]?.[0], JSON.stringify(refused.detail));
  const stranger = client({ token: "wrong-token" });
  assert.equal((await raised(AuthenticationError, () => stranger.runs.get(run.id))).status, 401);
  assert.equal((await raised(PermissionDenied, () => api.runs.stop(run.id, "no"))).status, 403);
  assert.equal((await raised(NotFound, () => api.runs.get(randomUUID()))).code, "not_found");
  const conflict = await raised(InvalidTransition, () => api.runs.cancel(run.id));
  assert.ok(conflict instanceof Conflict);
  assert.deepEqual([conflict.status, conflict.run?.status, conflict.run?.id], [409, "completed", run.id]);
  const key = randomUUID();
  await api.runs.create("demo", { deltas: 1, delay_ms: 0 }, { idempotencyKey: key });
  const mismatch = await raised(IdempotencyMismatch, () => api.runs.create("demo", { deltas: 2 }, { idempotencyKey: key }));
  assert.equal(mismatch.status, 422);
  const live = await api.runs.create("demo", LONG);
  await raised(InvalidTransition, () => api.runs.rerun(live.id));
  await api.runs.cancel(live.id);
  await raised(ValidationError, () => api.runs.rerun(run.id, { fromSeq: run.last_seq + 1 }));
  await raised(ValidationError, () => api.runs.events(run.id, { types: ["nope.*"] }));
});

test("a refused stream ends with its typed error and says why, never retrying", { timeout: 30_000 }, async () => {
  const api = client();
  const run = await api.runs.create("demo", { deltas: 2, delay_ms: 0, ask: "?" });
  const cases: [string, string, number, new (...args: never[]) => APIError, string][] = [
    ["wrong-token", run.id, 0, AuthenticationError, "not signed in (401)"],
    [env("RUNLEDGER_TOKEN"), randomUUID(), 0, NotFound, "no such run (404)"],
    // A cursor past the end of a live run.
    [env("RUNLEDGER_TOKEN"), run.id, 10_000, ValidationError, "(400)"],
  ];
  for (const [token, runId, afterSeq, cls, reason] of cases) {
    let requests = 0;
    const counted = client({ token, fetch: (input, init) => ((requests += 1), fetch(input, init)) });
    const states: string[] = [];
    const stream = counted.runs.stream(runId, { afterSeq, onState: (c) => states.push(c.state) });
    const failed = await raised(cls, async () => {
      for await (const _ of stream) assert.fail("no event expected");
    });
    const connection = stream.connection;
    assert.ok(connection.state === "refused" && connection.reason.endsWith(reason), JSON.stringify(connection));
    assert.equal(connection.error, failed);
    assert.deepEqual([states, requests], [["connecting", "refused"], 1]);
  }
  await api.runs.cancel(run.id);
});

test("a 429 carries its Retry-After; a 503 is retried, then thrown, one Idempotency-Key throughout", { timeout: 30_000 }, async () => {
  // Answers on demand (docs/design/fair-use.md#refusals), in the API's error shape, from a
  // stand-in server rather than a real one driven to its limits.
  const answer = (status: number, code: string, retryAfter: string) =>
    standIn((_request, response) => {
      const body = JSON.stringify({ error: { code, message: "slow down", detail: null } });
      response.writeHead(status, { "Content-Type": "application/json", "Retry-After": retryAfter }).end(body);
    });
  const busy = await answer(429, "too_many_requests", "7");
  try {
    const limited = await raised(TooManyRequests, () => client({ baseUrl: busy.url }).runs.get(randomUUID()));
    assert.deepEqual([limited.status, limited.retryAfter, limited.message, busy.requests.length], [429, 7, "slow down", 1]);
  } finally {
    await busy.close();
  }
  const down = await answer(503, "database_unavailable", "0");
  try {
    const api = client({ baseUrl: down.url, retry: { ...FAST, attempts: 3 } });
    assert.equal((await raised(DatabaseUnavailable, () => api.runs.create("demo"))).status, 503);
    const keys = down.requests.map((request) => request.headers["idempotency-key"]);
    assert.equal(keys.length, 3);
    assert.equal(new Set(keys).size, 1);
  } finally {
    await down.close();
  }
  const nowhere = await standIn(() => undefined);
  const url = nowhere.url;
  await nowhere.close();
  const unreachable = client({ baseUrl: url, retry: { ...FAST, attempts: 2 } });
  await assert.rejects(unreachable.runs.get(randomUUID()), ConnectionError);
});
