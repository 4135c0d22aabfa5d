// @runledger/client/react: the reducer that rebuilds a run's state from its log, and useRun
// rendered by React DOM (in jsdom) against the live server — in StrictMode, whose double effects
// must not open a second stream nor deliver an event twice; remounted as after a reload; its
// commands. The hook's proof in a real browser is the example app's (tests/client/test_react_example_browser.py).
import assert from "node:assert/strict";
import { test } from "node:test";
import { JSDOM } from "jsdom";
import { createElement, StrictMode } from "react";
import { createRoot, type Root } from "react-dom/client";
import { Client, PermissionDenied, type Run, type RunEvent } from "@runledger/client";
import {
  initialRunState,
  reduceRun,
  RunledgerProvider,
  statusAfter,
  useRun,
  type UseRunOptions,
  type UseRunResult,
} from "@runledger/client/react";
import { client, event, FAST, storedLog, waitFor } from "./support.js";

const dom = new JSDOM("<!doctype html><body></body>");
Object.assign(globalThis, { window: dom.window, document: dom.window.document });

// --- the reducer -----------------------------------------------------------------------------

const delta = (seq: number, text: string): RunEvent => event(seq, "output.delta", { text });

test("events give text and status, each seq once, in order", () => {
  let state = initialRunState();
  state = reduceRun(state, { type: "events", events: [event(1, "run.created"), event(2, "run.started"), delta(3, "Hel")] });
  state = reduceRun(state, { type: "events", events: [delta(3, "Hel"), delta(4, "lo"), delta(2, "x")] });
  assert.deepEqual([state.text, state.status, state.lastSeq], ["Hello", "running", 4]);
  assert.deepEqual(
    state.events.map((e) => e.seq),
    [1, 2, 3, 4],
  );
  const same = reduceRun(state, { type: "events", events: [delta(4, "lo")] });
  assert.equal(same, state, "a replay changes nothing, not even the object");
  state = reduceRun(state, { type: "events", events: [event(5, "run.waiting"), event(6, "run.resumed")] });
  assert.equal(state.status, "queued");
  state = reduceRun(state, { type: "events", events: [event(7, "run.started"), delta(8, "!"), event(9, "run.cancelled")] });
  assert.deepEqual([state.text, state.status], ["Hello!", "cancelled"]);
});

test("a read of the run moves the status only forward in seq", () => {
  const run = (status: Run["status"], lastSeq: number) => ({ status, last_seq: lastSeq }) as Run;
  let state = reduceRun(initialRunState(), { type: "events", events: [event(1, "run.created"), event(2, "run.started")] });
  state = reduceRun(state, { type: "run", run: run("queued", 1) }); // read before the start was seen
  assert.equal(state.status, "running");
  state = reduceRun(state, { type: "run", run: run("cancelled", 9) }); // a cancel's answer, ahead of its event
  assert.equal(state.status, "cancelled");
  state = reduceRun(state, { type: "events", events: [delta(3, "a")] });
  assert.deepEqual([state.status, state.text], ["cancelled", "a"]);
  assert.deepEqual(
    ["run.created", "run.started", "run.waiting", "run.resumed", "run.requeued", "run.failed", "output.delta"].map((type) =>
      statusAfter({ type }),
    ),
    ["queued", "running", "waiting", "queued", "queued", "failed", null],
  );
});

test("a cursor the app kept: the state starts after it", () => {
  const state = reduceRun(initialRunState(3), { type: "events", events: [delta(2, "old"), delta(4, "new")] });
  assert.deepEqual([state.text, state.events.length, state.lastSeq], ["new", 1, 4]);
});

// --- useRun, rendered ------------------------------------------------------------------------

/** A client whose requests are counted by path (a stream's, a read's). */
function counted(): { api: Client; streams: () => number; open: () => number } {
  let streams = 0;
  let open = 0;
  const api = client({
    retry: FAST,
    fetch: async (input, init) => {
      const path = new URL(String(input)).pathname;
      if (!path.endsWith("/stream/")) return fetch(input, init);
      streams += 1;
      open += 1;
      init?.signal?.addEventListener("abort", () => (open -= 1), { once: true });
      return fetch(input, init);
    },
  });
  return { api, streams: () => streams, open: () => open };
}

interface Mounted {
  latest: () => UseRunResult;
  html: () => string;
  unmount: () => void;
}

async function mount(api: Client, ids: string[], options: UseRunOptions = {}): Promise<Mounted> {
  const container = document.createElement("div");
  document.body.append(container);
  const root: Root = createRoot(container);
  let latest: UseRunResult | null = null;
  function Show(props: { id: string }) {
    const result = useRun(props.id, options);
    latest = result;
    return createElement("p", null, result.text);
  }
  const shown = ids.map((id, index) => createElement(Show, { id, key: index }));
  root.render(createElement(StrictMode, null, createElement(RunledgerProvider, { client: api }, ...shown)));
  await waitFor(() => latest !== null, 5_000, "the first render");
  return {
    latest: () => {
      assert.ok(latest !== null, "not rendered yet");
      return latest;
    },
    html: () => container.innerHTML,
    unmount: () => root.unmount(),
  };
}

test("in StrictMode a run is followed on one stream, every event once, its text the output's", { timeout: 60_000 }, async () => {
  const { api, streams } = counted();
  const run = await api.runs.create("demo", { deltas: 30, delay_ms: 10 });
  // Two components show the run: one stream for both.
  const page = await mount(api, [run.id, run.id]);
  const ended = await waitFor(() => page.latest().connection.state === "ended" && page.latest(), 30_000, "the end");
  const done = await waitFor(() => page.latest().run?.status === "completed" && page.latest(), 10_000, "the final read");
  assert.deepEqual(ended.events, await storedLog(api, run.id));
  assert.equal(done.text, (done.run?.output as { text: string }).text);
  assert.equal(done.status, "completed");
  assert.deepEqual(ended.connection, { state: "ended", status: "completed", aborted: false });
  assert.equal(page.html(), `<p>${done.text}</p><p>${done.text}</p>`);
  assert.equal(streams(), 1);
  page.unmount();
});

test("unmounting only disconnects; a remount, as after a reload, rebuilds the same state", { timeout: 60_000 }, async () => {
  const first = counted();
  const run = await first.api.runs.create("demo", { deltas: 60, delay_ms: 25 });
  const page = await mount(first.api, [run.id]);
  await waitFor(() => page.latest().lastSeq >= 8, 20_000, "some text");
  page.unmount();
  await waitFor(() => first.open() === 0, 5_000, "the stream closed");
  const after = await first.api.runs.get(run.id);
  assert.equal(after.status, "running", "an unmount never cancels");

  // A reload: a new client, a new tree, the same run id (kept in the URL, say).
  const second = counted();
  const reloaded = await mount(second.api, [run.id]);
  const done = await waitFor(() => reloaded.latest().run?.status === "completed" && reloaded.latest(), 40_000, "the end");
  assert.deepEqual(done.events, await storedLog(second.api, run.id));
  assert.equal(done.text, (done.run?.output as { text: string }).text);
  assert.equal(second.streams(), 1);
  reloaded.unmount();
});

test("the hook's commands answer the committed run, and a refusal lands in error", { timeout: 60_000 }, async () => {
  const { api } = counted();
  const run = await api.runs.create("demo", { deltas: 1000, delay_ms: 50 });
  const page = await mount(api, [run.id]);
  await waitFor(() => page.latest().status === "running", 20_000, "running");
  const denied = await page.latest().stop("no right to");
  assert.equal(denied, null);
  assert.ok(page.latest().error instanceof PermissionDenied);
  const cancelled = await page.latest().cancel("enough");
  assert.equal(cancelled?.status, "cancelled");
  const ended = await waitFor(() => page.latest().connection.state === "ended" && page.latest(), 20_000, "the end");
  assert.equal(ended.events.filter((e) => e.type === "run.cancelled").length, 1);
  assert.equal(ended.status, "cancelled");
  // Again: already cancelled, a success; a pause of an ended run, a 409 whose run is the truth.
  assert.equal((await page.latest().cancel())?.status, "cancelled");
  assert.equal((await page.latest().pause())?.status, "cancelled");
  assert.equal(page.latest().error?.name, "InvalidTransition");
  page.unmount();
});

test("a cursor the app kept: only what follows it is fetched and shown", { timeout: 60_000 }, async () => {
  const { api } = counted();
  const run = await api.runs.wait((await api.runs.create("demo", { deltas: 6, delay_ms: 0 })).id);
  const page = await mount(api, [run.id], { afterSeq: 5 });
  const done = await waitFor(() => page.latest().connection.state === "ended" && page.latest(), 20_000, "the end");
  assert.deepEqual(
    done.events.map((e) => e.seq),
    (await storedLog(api, run.id)).filter((e) => e.seq > 5).map((e) => e.seq),
  );
  assert.equal(done.text, "chunk 3 chunk 4 chunk 5 ");
  page.unmount();

});
