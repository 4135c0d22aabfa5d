// A run's events over SSE on fetch streams (so a token header works), each delivered once, in seq
// order, through any number of dropped connections (docs/design/clients.md#js-stream):
// - the cursor is the seq of the last event delivered; each connect asks `?after_seq=<cursor>`,
//   the cursor the server also reads from `Last-Event-ID` (docs/design/streaming.md#cursors) — in
//   the query, a cross-origin stream needs no allowed header beyond Authorization;
// - a frame counts only once its blank line arrived (src/sse.ts), so a frame cut off is read again;
// - a seq at or below the cursor is a replay: dropped; a seq past cursor + 1 is a gap (the server
//   never makes one): read from the events pages first — except with `types`, whose seqs have gaps
//   of their own (docs/design/streaming.md#types);
// - the stream ends at the terminal event or at a 204 (a finished run read to its end); 401, 403,
//   404 and 400 will not change by retrying: it stops with the typed error ("refused"); anything
//   else (a drop, a silence past streamTimeoutMs, 429, 502–504) is retried: after the server's
//   `retry:` once a stream was accepted, with a growing backoff after connects that were not;
// - closing it (close(), the caller's signal, leaving a `for await`) closes the connection and
//   nothing else: a dropped connection is not a cancellation.
import { APIError, ConnectionError, errorFrom, type RunledgerError } from "./errors.js";
import { backoff, jittered, sleep, type Query, type Transport } from "./http.js";
import { deltaText, terminalStatus, type EventPage, type RunEvent, type RunStatus } from "./models.js";
import { SSEDecoder } from "./sse.js";

export type StreamState = "connecting" | "live" | "reconnecting" | "ended" | "refused";

/** What a stream reports of its connection, for an app to show. */
export type ConnectionState =
  /** Opening the first connection. */
  | { state: "connecting" }
  /** The stream is open: events arrive as they are committed. */
  | { state: "live" }
  /** Waiting `delayMs` before connecting again (`failures`: connects in a row the server did not accept). */
  | { state: "reconnecting"; failures: number; delayMs: number; error: unknown }
  /** Nothing more will come: the run ended (`status`), or the stream was closed (`aborted`). */
  | { state: "ended"; status: RunStatus | null; aborted: boolean }
  /** Stopped for good without reaching the end: the server refused it (401, 403, 404, 400), or,
   *  with a finite `retry.streamAttempts`, could not be reached. */
  | { state: "refused"; reason: string; error: RunledgerError };

export interface StreamOptions {
  /** The seq of the last event the caller already has (0, the default: the whole log). */
  afterSeq?: number | undefined;
  /** Only these event types (`output.delta`, `run.*`) and the terminal event. */
  types?: string | readonly string[] | undefined;
  /** Aborting it ends the iteration and closes the connection; the run goes on. */
  signal?: AbortSignal | undefined;
  onState?: ((connection: ConnectionState) => void) | undefined;
}

// Answers that say "not now": reconnect after a wait, as after a drop.
const TRANSIENT = new Set([429, 502, 503, 504]);
const REASONS: Record<number, string> = {
  401: "not signed in (401)",
  403: "not allowed (403)",
  404: "no such run (404)",
};

export function typesParam(types: string | readonly string[] | undefined): string | undefined {
  if (types === undefined) return undefined;
  const joined = typeof types === "string" ? types : types.join(",");
  return joined === "" ? undefined : joined;
}

/** Wakes `stream` when the browser comes back online or the page is shown again (outside a browser,
 *  nothing); the function returned stops that. A page's stream, a React store's. */
export function wakeOnReturn(stream: RunStream): () => void {
  const events = globalThis as unknown as Partial<Pick<Window, "addEventListener" | "removeEventListener">>;
  const page = typeof document === "undefined" ? null : document;
  if (typeof events.addEventListener !== "function" || typeof events.removeEventListener !== "function") {
    return () => undefined;
  }
  const online = (): void => stream.wake();
  const shown = (): void => {
    if (page?.visibilityState === "visible") stream.wake();
  };
  events.addEventListener("online", online);
  page?.addEventListener("visibilitychange", shown);
  return () => {
    events.removeEventListener?.("online", online);
    page?.removeEventListener("visibilitychange", shown);
  };
}

export class RunStream implements AsyncIterable<RunEvent> {
  readonly runId: string;
  /** The run's terminal event, once delivered. */
  terminal: RunEvent | null = null;
  readonly #transport: Transport;
  readonly #types: string | undefined;
  readonly #onState: ((connection: ConnectionState) => void) | undefined;
  readonly #stop = new AbortController();
  readonly #signal: AbortSignal | undefined;
  #cursor: number;
  #connection: ConnectionState = { state: "connecting" };
  #open: AbortController | null = null;
  #wake: (() => void) | null = null;
  #lastByteAt = 0;
  #started = false;
  readonly #texts: string[] = [];

  constructor(transport: Transport, runId: string, options: StreamOptions = {}) {
    this.#transport = transport;
    this.runId = runId;
    this.#cursor = options.afterSeq ?? 0;
    this.#types = typesParam(options.types);
    this.#onState = options.onState;
    this.#signal = options.signal;
    if (options.signal?.aborted) this.#stop.abort(options.signal.reason);
    options.signal?.addEventListener("abort", this.#aborted, { once: true });
  }

  /** `connecting`, `live`, `reconnecting`, `ended` or `refused`. */
  get state(): StreamState {
    return this.#connection.state;
  }

  /** The state with its detail: the reason of a refusal, the wait before a reconnect, … */
  get connection(): ConnectionState {
    return this.#connection;
  }

  /** The seq of the last event delivered: where a new stream would resume. */
  get lastSeq(): number {
    return this.#cursor;
  }

  /** Ends the iteration and closes the connection. The run goes on. */
  close(): void {
    this.#stop.abort(new DOMException("the stream was closed", "AbortError"));
  }

  /** Connect now: skips the wait before a reconnect, and drops a connection that has been silent
   *  for more than `maxSilenceMs` (a tab that slept, a network that changed) to open a fresh one. */
  wake(maxSilenceMs = 20_000): void {
    if (this.#wake !== null) this.#wake();
    else if (this.#open !== null && this.state === "live" && Date.now() - this.#lastByteAt > maxSilenceMs) {
      this.#open.abort(new ConnectionError(`silent for more than ${maxSilenceMs} ms`));
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<RunEvent> {
    if (this.#started) throw new TypeError("a RunStream is read once: open another with runs.stream()");
    this.#started = true;
    return this.#events();
  }

  /** Reads the rest; the terminal event (null when the server had nothing more: a 204). */
  async untilEnd(): Promise<RunEvent | null> {
    for await (const _ of this) {
      // Read to the end.
    }
    return this.terminal;
  }

  /** Reads the rest, handing each event to `onEvent`; how the stream ended: `ended` (the run's end, or
   *  the stream closed: `aborted`) or `refused` — a refusal, reported through `onState`, is not thrown
   *  here. Any other error is. */
  async follow(onEvent: (event: RunEvent) => void): Promise<ConnectionState> {
    try {
      for await (const event of this) onEvent(event);
    } catch (error) {
      if (this.state !== "refused") throw error;
    }
    return this.connection;
  }

  /** Reads the rest; the text of every `output.delta` this stream delivered, joined. */
  async text(): Promise<string> {
    await this.untilEnd();
    return this.#texts.join("");
  }

  readonly #aborted = (): void => this.#stop.abort(this.#signal?.reason);

  #report(connection: ConnectionState): void {
    this.#connection = connection;
    this.#onState?.(connection);
  }

  #finished(): boolean {
    return this.state === "ended" || this.state === "refused";
  }

  async *#events(): AsyncGenerator<RunEvent, void, undefined> {
    const retry = this.#transport.retry;
    let failures = 0; // connects in a row that the server did not accept
    let retryMs: number | null = null; // the server's `retry:`
    try {
      this.#report({ state: "connecting" });
      while (!this.#stop.signal.aborted) {
        const open = new AbortController();
        const forward = (): void => open.abort(this.#stop.signal.reason);
        this.#stop.signal.addEventListener("abort", forward, { once: true });
        this.#open = open;
        const decoder = new SSEDecoder();
        let accepted = false;
        let notBeforeMs = 0;
        let lastError: unknown;
        try {
          const response = await this.#connect(open);
          if (response.status === 200 && response.body !== null) {
            accepted = true;
            failures = 0;
            this.#report({ state: "live" });
            yield* this.#read(response.body, decoder, open);
            if (this.#finished()) return;
            lastError = new ConnectionError("the stream ended before the run did");
          } else if (response.status === 204) {
            this.#report({ state: "ended", status: null, aborted: false });
            return;
          } else {
            const error = errorFrom(response.status, response.headers, await response.text().catch(() => ""));
            if (!TRANSIENT.has(response.status)) throw this.#refuse(error);
            lastError = error;
            notBeforeMs = (error.retryAfter ?? 0) * 1000;
          }
        } catch (error) {
          if (this.#stop.signal.aborted || this.#finished()) throw error;
          lastError = error;
        } finally {
          this.#stop.signal.removeEventListener("abort", forward);
          open.abort(); // closes the body, whatever ended the read
          this.#open = null;
          retryMs = decoder.retry ?? retryMs;
        }
        let delayMs: number;
        if (accepted) {
          delayMs = jittered(retryMs ?? retry.baseMs);
        } else {
          failures += 1;
          if (failures >= retry.streamAttempts) {
            const why = `${failures} connects failed in a row, the last: ${String(lastError)}`;
            throw this.#refuse(lastError instanceof APIError ? lastError : new ConnectionError(why, { cause: lastError }));
          }
          delayMs = Math.max(backoff(retry, failures, retryMs ?? 0), notBeforeMs);
        }
        this.#report({ state: "reconnecting", failures, delayMs, error: lastError });
        await sleep(delayMs, this.#stop.signal, (wake) => {
          this.#wake = wake;
        }).finally(() => {
          this.#wake = null;
        });
      }
    } catch (error) {
      if (!this.#stop.signal.aborted || this.#finished()) throw error;
    } finally {
      this.#signal?.removeEventListener("abort", this.#aborted);
      if (!this.#finished()) this.#report({ state: "ended", status: null, aborted: true });
    }
  }

  #refuse(error: RunledgerError): RunledgerError {
    const status = error instanceof APIError ? error.status : 0;
    const reason = REASONS[status] ?? (status ? `${error.message} (${status})` : error.message);
    this.#report({ state: "refused", reason, error });
    return error;
  }

  async #connect(open: AbortController): Promise<Response> {
    const query: Query = { after_seq: this.#cursor, types: this.#types };
    const path = `/api/runs/${encodeURIComponent(this.runId)}/stream/`;
    const ms = this.#transport.timeoutMs;
    const timer = setTimeout(() => open.abort(new ConnectionError(`no answer in ${ms} ms`)), ms);
    try {
      const call = { method: "GET", path, query, headers: { Accept: "text/event-stream" }, idempotent: true };
      return await this.#transport.fetch({ ...call, signal: this.#stop.signal }, open.signal);
    } finally {
      clearTimeout(timer);
    }
  }

  async *#read(body: ReadableStream<Uint8Array>, decoder: SSEDecoder, open: AbortController): AsyncGenerator<RunEvent> {
    const reader = body.getReader();
    const silence = this.#transport.streamTimeoutMs;
    try {
      for (;;) {
        // Only the wait for bytes is timed: a slow reader of the events is not a silent stream.
        const timer = setTimeout(() => open.abort(new ConnectionError(`silent for ${silence} ms`)), silence);
        const { value, done } = await reader.read().finally(() => clearTimeout(timer));
        if (done) return;
        this.#lastByteAt = Date.now();
        for (const frame of decoder.feed(value)) {
          if (open.signal.aborted) return; // closed, or dropped: nothing more from this connection
          if (frame.id === null || !/^\d+$/.test(frame.id)) continue; // every event of a run carries its seq
          const seq = Number(frame.id);
          if (seq <= this.#cursor) continue; // delivered already
          if (seq > this.#cursor + 1 && this.#types === undefined) yield* this.#fill(seq, open.signal);
          if (seq <= this.#cursor) continue;
          yield this.#deliver(JSON.parse(frame.data) as RunEvent);
          if (this.terminal !== null) return;
        }
      }
    } finally {
      reader.cancel().catch(() => undefined);
    }
  }

  /** The events between the cursor and `seq`, from the JSON pages (each bounded: read on). */
  async *#fill(seq: number, signal: AbortSignal): AsyncGenerator<RunEvent> {
    const path = `/api/runs/${encodeURIComponent(this.runId)}/events/`;
    while (this.#cursor < seq - 1) {
      const before = this.#cursor;
      const query = { after_seq: before, limit: 1000 };
      const page = await this.#transport.send<EventPage>({ method: "GET", path, query, idempotent: true, signal });
      for (const event of page.results) {
        if (signal.aborted) return;
        if (event.seq > this.#cursor && event.seq < seq) yield this.#deliver(event);
      }
      if (this.#cursor === before) throw new ConnectionError(`the events pages have nothing after seq ${before}`);
    }
  }

  #deliver(event: RunEvent): RunEvent {
    this.#cursor = event.seq;
    this.#texts.push(deltaText(event));
    const status = terminalStatus(event);
    if (status !== null) {
      this.terminal = event;
      // Before the event is handed out: a reader that stops at it finds the stream ended.
      this.#report({ state: "ended", status, aborted: false });
    }
    return event;
  }
}
