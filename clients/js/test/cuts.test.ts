// One round of streams through the cutting proxy (tests/support/proxies.py CuttableProxy, every
// stream connection cut after a random number of bytes, anywhere in a frame): five runs streamed
// live at once while the worker executes them, one of them with chosen types; each stream must be
// exactly the stored log. tests/client/test_js_client.py runs rounds until 200 cuts or more fell, and
// compares what this reports (RUNLEDGER_REPORT) with the database too.
import assert from "node:assert/strict";
import { test } from "node:test";
import type { RunEvent } from "@runledger/client";
import { client, env, report, storedLog } from "./support.js";

const DEMO = { deltas: 120, delay_ms: 2 };

test("streams through the cuts are exactly the stored logs", { timeout: 120_000 }, async () => {
  const cut = client({ baseUrl: env("RUNLEDGER_PROXY_URL") });
  const direct = client();
  const chosen: (string[] | undefined)[] = [undefined, undefined, undefined, undefined, ["output.delta", "run.started"]];
  const streamed = await Promise.all(
    chosen.map(async (types) => {
      const run = await cut.runs.create("demo", DEMO);
      const events: RunEvent[] = [];
      for await (const e of cut.runs.stream(run.id, { types })) events.push(e);
      return { runId: run.id, types: types ?? null, events };
    }),
  );
  for (const { runId, types, events } of streamed) {
    assert.deepEqual(events, await storedLog(direct, runId, types ?? undefined));
    assert.equal(events.at(-1)?.type, "run.completed");
  }
  report(`round-${env("RUNLEDGER_ROUND")}`, streamed);
});
