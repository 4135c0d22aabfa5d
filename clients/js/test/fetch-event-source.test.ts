// The real @microsoft/fetch-event-source, the fetch-based SSE client many React apps use, through
// the cutting proxy (docs/design/streaming.md#frames). It takes an event's id when it parses the
// `id:` line, not when the event is dispatched; with `id:` last, that loses an event only when a
// cut falls between the `id:` line and the blank line ending its frame. This reports what each
// run's stream delivered (RUNLEDGER_REPORT); tests/client/test_js_client.py counts the losses against
// the cuts that fell in a frame's last byte.
import assert from "node:assert/strict";
import { test } from "node:test";
import { fetchEventSource } from "@microsoft/fetch-event-source";
import { client, env, report } from "./support.js";

// It is a browser library: it reads `window` and `document` (for its visibility handling, which
// openWhenHidden turns off).
const page = globalThis as unknown as Record<string, unknown>;
page["window"] ??= globalThis;
page["document"] ??= { hidden: false, addEventListener: () => undefined, removeEventListener: () => undefined };

class Fatal extends Error {}

async function follow(runId: string): Promise<number[]> {
  const seqs: number[] = [];
  let ended = false;
  const abort = new AbortController();
  await fetchEventSource(`${env("RUNLEDGER_PROXY_URL")}/api/runs/${runId}/stream/`, {
    headers: { Authorization: `Token ${env("RUNLEDGER_TOKEN")}` },
    signal: abort.signal,
    openWhenHidden: true,
    async onopen(response) {
      // 204: the run ended and its last event was the id it resumed after.
      if (response.status === 204) {
        ended = true;
        throw new Fatal("204");
      }
      if (response.status !== 200) throw new Fatal(`HTTP ${response.status}`);
    },
    onmessage(message) {
      if (message.data === "") return; // it calls this at every blank line: after `retry:` too
      seqs.push(Number(message.id));
      if (message.event === "run.completed") ended = true;
    },
    onclose() {
      // A cut ends the body as a normal close would: retry unless the run ended.
      if (!ended) throw new Error("cut");
      abort.abort();
    },
    onerror(error) {
      if (error instanceof Fatal) throw error;
      return 20;
    },
  }).catch((error: unknown) => {
    if (!(error instanceof Fatal && ended)) throw error;
  });
  return seqs;
}

test("fetch-event-source through the cuts", { timeout: 120_000 }, async () => {
  const api = client({ baseUrl: env("RUNLEDGER_PROXY_URL") });
  const runs = await Promise.all([0, 1, 2].map(() => api.runs.create("demo", { deltas: 120, delay_ms: 2 })));
  const delivered = await Promise.all(runs.map((run) => follow(run.id)));
  for (const seqs of delivered) {
    assert.deepEqual(seqs, [...new Set(seqs)].sort((a, b) => a - b), "a seq twice, or out of order");
  }
  report("fetch-event-source", Object.fromEntries(runs.map((run, index) => [run.id, delivered[index]])));
});
