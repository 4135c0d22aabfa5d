// One run followed for the components that show it (docs/design/clients.md#react): the state of
// src/react/state.ts, fed by one stream however many components (or StrictMode's double effects)
// subscribe. The first subscriber opens it — reading the run and streaming its log from the
// cursor, so a reload rebuilds the same state — and the stream closes a moment after the last
// one left: a remount in between (StrictMode's) keeps it. Closing only disconnects: it never
// cancels the run. The browser's `online` and `visibilitychange` wake a stream that waits to
// reconnect, or that a sleeping tab left silent.
import type { Client } from "../client.js";
import { APIError } from "../errors.js";
import type { Run, RunEvent, StopCode } from "../models.js";
import { typesParam, wakeOnReturn, type RunStream } from "../stream.js";
import { initialRunState, reduceRun, type RunAction, type RunState } from "./state.js";

export interface RunStoreOptions {
  /** Stream from after this seq (a cursor the app kept); 0, the default, rebuilds the whole log. */
  afterSeq?: number | undefined;
  types?: string | readonly string[] | undefined;
}

/** The commands of a followed run: each resolves with the committed run — the answer, or the
 *  run a 409 carried — or null; a refusal is in `error` too, never an unhandled rejection. */
export interface RunCommands {
  cancel(note?: string): Promise<Run | null>;
  stop(reason: string, code?: StopCode): Promise<Run | null>;
  pause(): Promise<Run | null>;
  /** With the run's current `resume_ticket` unless one is given. */
  resume(input?: unknown, ticket?: string): Promise<Run | null>;
}

export class RunStore implements RunCommands {
  readonly client: Client;
  readonly runId: string;
  readonly #types: string | undefined;
  readonly #forget: () => void;
  readonly #listeners = new Set<() => void>();
  #state: RunState;
  #stream: RunStream | null = null;
  #abort: AbortController | null = null;
  #detach: () => void = () => undefined;
  #pending: RunEvent[] = [];
  #reading = false;
  #readAgain = false;
  #flushTimer: ReturnType<typeof setTimeout> | undefined;
  #closeTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(client: Client, runId: string, options: RunStoreOptions = {}, forget: () => void = () => undefined) {
    this.client = client;
    this.runId = runId;
    this.#types = typesParam(options.types);
    this.#state = initialRunState(options.afterSeq ?? 0);
    this.#forget = forget;
  }

  /** For useSyncExternalStore: a stable function. */
  readonly subscribe = (listener: () => void): (() => void) => {
    this.#listeners.add(listener);
    clearTimeout(this.#closeTimer);
    if (this.#stream === null) this.#open();
    return () => {
      this.#listeners.delete(listener);
      if (this.#listeners.size === 0) this.#closeTimer = setTimeout(() => this.#close(), 0);
    };
  };

  readonly getSnapshot = (): RunState => this.#state;

  /** Whether a stream is open (or waiting to reconnect) for this run. */
  get following(): boolean {
    return this.#stream !== null;
  }

  cancel(note?: string): Promise<Run | null> {
    return this.#command(() => this.client.runs.cancel(this.runId, { note }));
  }

  stop(reason: string, code?: StopCode): Promise<Run | null> {
    return this.#command(() => this.client.runs.stop(this.runId, reason, { code }));
  }

  pause(): Promise<Run | null> {
    return this.#command(() => this.client.runs.pause(this.runId));
  }

  resume(input?: unknown, ticket?: string): Promise<Run | null> {
    const current = ticket ?? this.#state.run?.resume_ticket;
    if (!current) {
      this.#dispatch({ type: "error", error: new Error("no resume ticket: the run does not wait, or you may not resume it") });
      return Promise.resolve(null);
    }
    return this.#command(() => this.client.runs.resume(this.runId, current, input));
  }

  #dispatch(action: RunAction): void {
    const next = reduceRun(this.#state, action);
    if (next === this.#state) return;
    this.#state = next;
    for (const listener of [...this.#listeners]) listener();
  }

  async #command(send: () => Promise<Run>): Promise<Run | null> {
    try {
      const run = await send();
      this.#dispatch({ type: "run", run });
      return run;
    } catch (error) {
      if (error instanceof APIError && error.run !== null) this.#dispatch({ type: "run", run: error.run });
      this.#dispatch({ type: "error", error: error as Error });
      return error instanceof APIError ? error.run : null;
    }
  }

  #open(): void {
    const abort = new AbortController();
    const stream = this.client.runs.stream(this.runId, {
      afterSeq: this.#state.lastSeq,
      types: this.#types,
      signal: abort.signal,
      onState: (connection) => {
        this.#flush();
        this.#dispatch({ type: "connection", connection });
        // A read at mount that failed (the network was gone) is tried again once the stream is back.
        if (connection.state === "live" && this.#state.run === null) void this.#read(abort.signal);
      },
    });
    this.#abort = abort;
    this.#stream = stream;
    this.#detach = wakeOnReturn(stream);
    void this.#read(abort.signal);
    void this.#follow(stream, abort.signal);
  }

  #close(): void {
    if (this.#listeners.size > 0) return;
    this.#abort?.abort();
    this.#detach();
    this.#flush();
    this.#stream = null;
    this.#abort = null;
    this.#forget();
  }

  /** Reads the run; a read asked for while one is under way is made after it (the last one asked
   *  for, at the end of the run, must see the end). */
  async #read(signal: AbortSignal): Promise<void> {
    if (this.#reading) {
      this.#readAgain = true;
      return;
    }
    this.#reading = true;
    try {
      do {
        this.#readAgain = false;
        try {
          this.#dispatch({ type: "run", run: await this.client.runs.get(this.runId, { signal }) });
        } catch (error) {
          if (!signal.aborted) this.#dispatch({ type: "error", error: error as Error });
        }
      } while (this.#readAgain && !signal.aborted);
    } finally {
      this.#reading = false;
    }
  }

  async #follow(stream: RunStream, signal: AbortSignal): Promise<void> {
    try {
      for await (const event of stream) {
        this.#pending.push(event);
        // Events that arrive together are shown together: one update a batch, not one an event.
        this.#flushTimer ??= setTimeout(() => this.#flush(), 0);
      }
      this.#flush();
      // Its final facts (output, ended_at, usage) are the run's, read once it ended.
      if (stream.terminal !== null) await this.#read(signal);
    } catch (error) {
      this.#flush();
      if (!signal.aborted) this.#dispatch({ type: "error", error: error as Error });
    }
  }

  #flush(): void {
    clearTimeout(this.#flushTimer);
    this.#flushTimer = undefined;
    if (this.#pending.length === 0) return;
    const events = this.#pending;
    this.#pending = [];
    this.#dispatch({ type: "events", events });
  }
}

const registry = new WeakMap<Client, Map<string, RunStore>>();

/** The store of `runId` on `client` with these options: the same one for every component that
 *  shows it, so they share one stream. */
export function runStore(client: Client, runId: string, options: RunStoreOptions = {}): RunStore {
  const key = JSON.stringify([runId, options.afterSeq ?? 0, typesParam(options.types) ?? null]);
  let stores = registry.get(client);
  if (stores === undefined) {
    stores = new Map();
    registry.set(client, stores);
  }
  const known = stores.get(key);
  if (known !== undefined) return known;
  const forget = (): void => {
    if (stores.get(key) === store) stores.delete(key);
  };
  const store = new RunStore(client, runId, options, forget);
  stores.set(key, store);
  return store;
}
