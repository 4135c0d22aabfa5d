// `client.runs`: create, read, follow and command runs (docs/design/api.md), named as the Python
// client names them, in camelCase.
import { TimeoutError } from "./errors.js";
import { newKey, sleep, type Query, type Transport } from "./http.js";
import {
  isTerminal,
  type CancelBody,
  type CreateRunBody,
  type EventPage,
  type RerunBody,
  type ResumeBody,
  type Run,
  type RunListItem,
  type RunStatus,
  type StopBody,
  type StopCode,
  type WaitedRun,
} from "./models.js";
import { Pages } from "./pages.js";
import { RunStream, typesParam, type StreamOptions } from "./stream.js";

export interface CallOptions {
  /** Aborts the request (and its retries). A command already sent may still have been done. */
  signal?: AbortSignal | undefined;
}

/** The budgets and labels a run may be given at create and rerun (docs/design/api.md#create). */
export interface RunSettings {
  /** Your labels, string to string (docs/design/api.md#metadata). */
  metadata?: Record<string, string> | undefined;
  maxSteps?: number | null | undefined;
  maxEvents?: number | null | undefined;
  maxAttempts?: number | null | undefined;
  /** An absolute time. */
  deadline?: Date | string | null | undefined;
}

export interface CreateOptions extends RunSettings, CallOptions {
  /** A run you can see, as this one's parent. */
  parent?: string | null | undefined;
  /** -100…100 among your own queued runs (docs/design/fair-use.md#priority). */
  priority?: number | undefined;
  /** Not started before this time. */
  startAfter?: Date | string | null | undefined;
  /** Made here unless given: a retry after a lost answer returns the same run, never a second. */
  idempotencyKey?: string | undefined;
}

export interface RerunOptions extends RunSettings, CallOptions {
  /** Fork: continue from a copy of the original's agent events up to this seq. */
  fromSeq?: number | null | undefined;
  agent?: string | undefined;
  input?: Record<string, unknown> | undefined;
}

/** The run list's filters (docs/design/api.md#lists): every one given must hold. */
export interface RunFilters extends CallOptions {
  status?: RunStatus | readonly RunStatus[] | undefined;
  endCode?: string | readonly string[] | undefined;
  agent?: string | undefined;
  parent?: string | undefined;
  /** Inclusive. */
  createdAfter?: Date | string | undefined;
  /** Exclusive. */
  createdBefore?: Date | string | undefined;
  /** Runs whose metadata holds every key with its value. */
  metadata?: Record<string, string> | undefined;
  /** Default 50, at most 500. */
  pageSize?: number | undefined;
}

export interface EventsOptions extends CallOptions {
  afterSeq?: number | undefined;
  /** Default 100, at most 1000. */
  limit?: number | undefined;
  types?: string | readonly string[] | undefined;
}

export interface WaitOptions extends CallOptions {
  /** Also wait until the run's attempt is released: the worker stopped executing it. */
  released?: boolean | undefined;
  /** Give up (TimeoutError) after this long; default: never. */
  timeoutMs?: number | undefined;
}

// The longest wait the server grants one request (docs/design/streaming.md#wait).
const WAIT_MAX_SECONDS = 60;

function runPath(runId: string, action = ""): string {
  return `/api/runs/${encodeURIComponent(runId)}/` + (action ? `${action}/` : "");
}

function isoTime(value: Date | string | null | undefined): string | null | undefined {
  return value instanceof Date ? value.toISOString() : value;
}

function commaList(value: string | readonly string[] | undefined): string | undefined {
  return value === undefined || typeof value === "string" ? value : value.join(",");
}

/** The fields given, without those left undefined (the server's defaults apply to them). */
function given<T extends object>(fields: T): T {
  return Object.fromEntries(Object.entries(fields).filter(([, value]) => value !== undefined)) as T;
}

function settings(options: RunSettings): Partial<CreateRunBody> {
  return {
    metadata: options.metadata,
    max_steps: options.maxSteps,
    max_events: options.maxEvents,
    max_attempts: options.maxAttempts,
    deadline: isoTime(options.deadline),
  };
}

export class Runs {
  readonly #transport: Transport;

  constructor(transport: Transport) {
    this.#transport = transport;
  }

  /** Create a run (201). Sent with an `Idempotency-Key` (made here unless given), so a retry after
   *  a lost answer returns the same run instead of making a second one. */
  create(agent: string, input: Record<string, unknown> = {}, options: CreateOptions = {}): Promise<Run> {
    const body: CreateRunBody = given({
      agent,
      input,
      ...settings(options),
      parent: options.parent,
      priority: options.priority,
      start_after: isoTime(options.startAfter),
    });
    const headers = { "Idempotency-Key": options.idempotencyKey ?? newKey() };
    return this.#send("POST", "/api/runs/", options, { body, headers });
  }

  get(runId: string, options: CallOptions = {}): Promise<Run> {
    return this.#send("GET", runPath(runId), options);
  }

  /** The runs you can see that match `filters`, newest first, fetched page by page as you iterate:
   *  `for await (const run of client.runs.list({ status: "running" }))`, or `.toArray()`. */
  list(filters: RunFilters = {}): Pages<RunListItem> {
    const query: Query = {
      status: commaList(filters.status),
      end_code: commaList(filters.endCode),
      agent: filters.agent,
      parent: filters.parent,
      created_after: isoTime(filters.createdAfter),
      created_before: isoTime(filters.createdBefore),
      page_size: filters.pageSize,
    };
    for (const [key, value] of Object.entries(filters.metadata ?? {})) query[`metadata.${key}`] = value;
    return new Pages(this.#transport, "/api/runs/", query, filters.signal);
  }

  /** One JSON page of events with seq > afterSeq; with `types`, only those and the terminal event. */
  events(runId: string, options: EventsOptions = {}): Promise<EventPage> {
    const query = { after_seq: options.afterSeq ?? 0, limit: options.limit, types: typesParam(options.types) };
    return this.#send("GET", runPath(runId, "events"), options, { query });
  }

  /** The run's events with seq > afterSeq, live, until its terminal event: iterate it with
   *  `for await`. Reconnects by itself after any drop, never delivers a seq twice; reports its
   *  connection (`onState`, `.state`); a 401, 403, 404 or 400 ends it with the typed error. */
  stream(runId: string, options: StreamOptions = {}): RunStream {
    return new RunStream(this.#transport, runId, options);
  }

  /** The run once it is terminal, through the server's wait (a run that waits for a resume is
   *  followed on its stream); with `released`, once its attempt is released too. */
  async wait(runId: string, options: WaitOptions = {}): Promise<Run> {
    const deadline = options.timeoutMs === undefined ? null : Date.now() + options.timeoutMs;
    let run = await this.#serverWait(runId, deadline, options.signal);
    while (!isTerminal(run.status)) {
      if ((run as Partial<WaitedRun>).wait_result === "waiting") {
        // The server answers at once while the run waits for a resume: follow its stream, through
        // the resume, to its end.
        await this.#follow(runId, run.last_seq, deadline, options.signal);
        run = await this.get(runId, options);
      } else {
        run = await this.#serverWait(runId, deadline, options.signal);
      }
    }
    // Nothing follows the terminal event: the release is polled, briefly.
    let interval = 50;
    while (options.released && run.attempt && run.attempt.released_at === null) {
      await sleep(Math.min(interval, remaining(deadline, interval)), options.signal);
      if (deadline !== null && Date.now() >= deadline) throw new TimeoutError("the run's attempt was not released in time");
      interval = Math.min(1000, interval * 1.5);
      run = await this.get(runId, options);
    }
    return run;
  }

  /** Cancel a queued, running or waiting run; a run already cancelled is returned as it is. A run
   *  that ended otherwise throws InvalidTransition, whose `run` is the committed one. */
  cancel(runId: string, options: CallOptions & { note?: string | undefined } = {}): Promise<Run> {
    const body: CancelBody = given({ note: options.note });
    return this.#send("POST", runPath(runId, "cancel"), options, { body });
  }

  /** Stop a run (needs runs.stop_run); `code` staff (default), policy, budget_exhausted or deadline_exceeded. */
  stop(runId: string, reason: string, options: CallOptions & { code?: StopCode | undefined } = {}): Promise<Run> {
    const body: StopBody = given({ reason, code: options.code });
    return this.#send("POST", runPath(runId, "stop"), options, { body });
  }

  /** Pause: a queued run waits at once; a running one is parked by its worker at its next safe
   *  boundary (the run answered is then still `running`). */
  pause(runId: string, options: CallOptions = {}): Promise<Run> {
    return this.#send("POST", runPath(runId, "pause"), options);
  }

  /** Resume a waiting run with its `resume_ticket` (safe to retry with the same input). */
  resume(runId: string, ticket: string, input?: unknown, options: CallOptions = {}): Promise<Run> {
    const body: ResumeBody = { ticket, input: input ?? null };
    return this.#send("POST", runPath(runId, "resume"), options, { body });
  }

  /** A new run of the ended run's agent, input and budgets (each as `options` says), its
   *  `rerun_of` the original; with `fromSeq`, a fork. Not retried after a lost answer: a second
   *  try would make a second run. */
  rerun(runId: string, options: RerunOptions = {}): Promise<Run> {
    const body: RerunBody = given({
      ...settings(options),
      from_seq: options.fromSeq,
      agent: options.agent,
      input: options.input,
    });
    return this.#send("POST", runPath(runId, "rerun"), options, { body, idempotent: false });
  }

  #send<T>(
    method: string,
    path: string,
    options: CallOptions,
    extra: { body?: unknown; query?: Query; headers?: Record<string, string>; idempotent?: boolean } = {},
  ): Promise<T> {
    return this.#transport.send<T>({ method, path, signal: options.signal, idempotent: true, ...extra });
  }

  #serverWait(runId: string, deadline: number | null, signal: AbortSignal | undefined): Promise<Run> {
    if (deadline !== null && Date.now() >= deadline) return Promise.reject(new TimeoutError(`run ${runId} did not end in time`));
    const seconds = Math.max(0.001, remaining(deadline, WAIT_MAX_SECONDS * 1000) / 1000);
    const query = { timeout: seconds.toFixed(3) };
    const timeoutMs = seconds * 1000 + this.#transport.timeoutMs;
    return this.#transport.send<WaitedRun>({ method: "GET", path: runPath(runId, "wait"), query, idempotent: true, signal, timeoutMs });
  }

  async #follow(runId: string, afterSeq: number, deadline: number | null, signal: AbortSignal | undefined): Promise<void> {
    const stop = new AbortController();
    const forward = (): void => stop.abort(signal?.reason);
    signal?.addEventListener("abort", forward, { once: true });
    const timer = deadline === null ? undefined : setTimeout(() => stop.abort(), remaining(deadline, Infinity));
    try {
      await this.stream(runId, { afterSeq, signal: stop.signal }).untilEnd();
      signal?.throwIfAborted();
      if (deadline !== null && Date.now() >= deadline) throw new TimeoutError(`run ${runId} did not end in time`);
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", forward);
    }
  }
}

/** `defaultMs`, or less when `deadline` (a Date.now()) comes sooner. */
function remaining(deadline: number | null, defaultMs: number): number {
  return deadline === null ? defaultMs : Math.max(0, Math.min(defaultMs, deadline - Date.now()));
}
