// What the package's tests share. They run against a live Runledger that tests/client/test_js_client.py
// starts (uvicorn, a worker, a cutting proxy) and describes in the environment; run alone they
// fail at once, naming the variable.
import { writeFileSync, readFileSync, existsSync } from "node:fs";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { Client, type ClientOptions, type RunEvent } from "@runledger/client";

export function env(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: these tests run through pytest (tests/client/test_js_client.py)`);
  return value;
}

// Short waits, as the Python client's tests use: the server's `retry:` is 20 ms there.
export const FAST = { baseMs: 20, capMs: 200 };

/** A client of the user RUNLEDGER_TOKEN, straight to the web process unless `baseUrl` says. */
export function client(options: Partial<ClientOptions> = {}): Client {
  return new Client({ baseUrl: env("RUNLEDGER_URL"), token: env("RUNLEDGER_TOKEN"), retry: FAST, ...options });
}

/** Polls `probe` until it answers something truthy, at most `timeoutMs`. */
export async function waitFor<T>(
  probe: () => T | Promise<T>,
  timeoutMs: number,
  what: string,
): Promise<Exclude<T, false | 0 | "" | null | undefined>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const answer = await probe();
    if (answer) return answer as Exclude<T, false | 0 | "" | null | undefined>;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** Every stored event of a run (its JSON pages, read to the end), with `types` if given. */
export async function storedLog(api: Client, runId: string, types?: string[]): Promise<RunEvent[]> {
  const events: RunEvent[] = [];
  let afterSeq = 0;
  for (;;) {
    const page = await api.runs.events(runId, { afterSeq, limit: 1000, types });
    events.push(...page.results);
    if (page.end_of_stream) return events;
    if (page.results.length === 0) throw new Error(`run ${runId} has not ended`);
    afterSeq = page.next_after_seq;
  }
}

/** Adds `value` under `key` to the JSON report the pytest side reads (RUNLEDGER_REPORT). */
export function report(key: string, value: unknown): void {
  const path = env("RUNLEDGER_REPORT");
  const current = existsSync(path) ? (JSON.parse(readFileSync(path, "utf-8")) as Record<string, unknown>) : {};
  writeFileSync(path, JSON.stringify({ ...current, [key]: value }));
}

export interface StandIn {
  url: string;
  requests: IncomingMessage[];
  close(): Promise<void>;
}

/** A stand-in HTTP server on a loopback port, answering as `handler` says: for what a real server
 *  does not do on demand (a 429 with Retry-After, a stream with a gap in its seqs). */
export async function standIn(handler: (request: IncomingMessage, response: ServerResponse) => void): Promise<StandIn> {
  const requests: IncomingMessage[] = [];
  const server = createServer((request, response) => {
    requests.push(request);
    handler(request, response);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** One SSE frame as the server writes it: event, data, then id (docs/design/streaming.md#frames). */
export function frame(event: RunEvent): string {
  return `event: ${event.type}\ndata: ${JSON.stringify(event)}\nid: ${event.seq}\n\n`;
}

export function event(seq: number, type: string, data: Record<string, unknown> = {}): RunEvent {
  return { seq, type, data, created_at: new Date(0).toISOString(), attempt: 1 };
}

/** The value of a gauge in a /metrics/ scrape (Prometheus text), 0 when absent. */
export async function gauge(name: string): Promise<number> {
  const response = await fetch(`${env("RUNLEDGER_URL")}/metrics/`, {
    headers: { Authorization: `Token ${env("RUNLEDGER_STAFF_TOKEN")}` },
  });
  const text = await response.text();
  const line = text.split("\n").find((l) => l.startsWith(`${name} `) || l.startsWith(`${name}{`));
  return line === undefined ? 0 : Number(line.trim().split(/\s+/).pop());
}
