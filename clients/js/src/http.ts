// The client's way to the server, shared by every call: the URL and headers of a request, the
// retry policy, and the one error for an answer that is not a success (docs/design/clients.md#js).
import { ConnectionError, errorFrom } from "./errors.js";

/** How hard the client tries before it throws (the Python client's `Retry`, in milliseconds). */
export interface RetryOptions {
  /**
   * Tries of a request that is safe to repeat (GETs, `create` with its Idempotency-Key, and the
   * commands, which the server makes idempotent) when the connection fails or the server answers
   * 502/503/504. Default 5.
   */
  attempts: number;
  /**
   * Connects in a row the server did not accept after which a stream gives up. Default: never —
   * a page keeps following its run through any outage, as EventSource does.
   */
  streamAttempts: number;
  /** The first wait (ms); waits double up to `capMs`, times a random 1–1.5. Defaults 200 and 5000. */
  baseMs: number;
  capMs: number;
}

export const DEFAULT_RETRY: RetryOptions = { attempts: 5, streamAttempts: Infinity, baseMs: 200, capMs: 5000 };

export interface ClientOptions {
  /** Where the app is mounted: `https://runs.example.com`, or "" (or `/runledger`) on the same site. */
  baseUrl: string;
  /** An API token, sent as `Authorization: Token <key>` (docs/design/api.md#tokens). */
  token?: string | undefined;
  /**
   * Whether the browser sends its cookies (a session) with each request: fetch's own option.
   * `include` for a session cookie on another origin (docs/design/clients.md#js).
   */
  credentials?: RequestCredentials | undefined;
  /**
   * The CSRF token a session's writes need (`X-CSRFToken`), or a function that reads it (e.g.
   * from the `csrftoken` cookie: `csrfTokenFromCookie`). Not needed with a token.
   */
  csrfToken?: string | (() => string | null | undefined) | undefined;
  /** A fetch of your own (a test's, a framework's); default: the global one. */
  fetch?: typeof fetch | undefined;
  /** Headers sent with every request. */
  headers?: Record<string, string> | undefined;
  retry?: Partial<RetryOptions> | undefined;
  /** How long a request may take (ms, default 30 000). */
  timeoutMs?: number | undefined;
  /**
   * The longest silence of an open stream (ms, default 60 000; the server sends a keep-alive
   * every 15 s): past it the connection counts as dropped and the stream reconnects.
   */
  streamTimeoutMs?: number | undefined;
}

export type Query = Record<string, string | number | undefined | null>;

export interface Call {
  method: string;
  path: string;
  query?: Query | undefined;
  body?: unknown;
  headers?: Record<string, string> | undefined;
  /** Safe to send again after a failure that may have reached the server. */
  idempotent: boolean;
  signal?: AbortSignal | undefined;
  timeoutMs?: number | undefined;
}

// What the server may answer when it will be back soon; a call safe to repeat is retried.
const TRANSIENT = new Set([502, 503, 504]);
const SAFE_METHODS = new Set(["GET", "HEAD", "OPTIONS"]);

export class Transport {
  readonly baseUrl: string;
  readonly retry: RetryOptions;
  readonly timeoutMs: number;
  readonly streamTimeoutMs: number;
  readonly #options: ClientOptions;
  readonly #fetch: typeof fetch;

  constructor(options: ClientOptions) {
    if (typeof options?.baseUrl !== "string") throw new TypeError("Client needs a baseUrl (\"\" for this site)");
    this.#options = options;
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.retry = { ...DEFAULT_RETRY, ...options.retry };
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.streamTimeoutMs = options.streamTimeoutMs ?? 60_000;
    const given = options.fetch ?? globalThis.fetch;
    if (typeof given !== "function") throw new TypeError("no fetch: give Client a `fetch`");
    // Called unbound, a browser's fetch throws "Illegal invocation".
    this.#fetch = (input, init) => given(input, init);
  }

  url(path: string, query?: Query): string {
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(query ?? {})) {
      if (value !== undefined && value !== null) params.append(name, String(value));
    }
    const search = params.toString();
    return this.baseUrl + path + (search ? `?${search}` : "");
  }

  headers(method: string, extra?: Record<string, string>, json = false): Headers {
    const headers = new Headers({ Accept: "application/json", ...this.#options.headers, ...extra });
    if (json) headers.set("Content-Type", "application/json");
    if (this.#options.token) headers.set("Authorization", `Token ${this.#options.token}`);
    if (!SAFE_METHODS.has(method)) {
      const csrf = this.#options.csrfToken;
      const value = typeof csrf === "function" ? csrf() : csrf;
      if (value) headers.set("X-CSRFToken", value);
    }
    return headers;
  }

  /** One request, no retry, aborted by `signal` (the call's own, a timeout's, a stream's): the
   *  answer whatever its status. Throws the call's abort, or ConnectionError. */
  async fetch(call: Call, signal: AbortSignal): Promise<Response> {
    const json = call.body !== undefined;
    const init: RequestInit = { method: call.method, headers: this.headers(call.method, call.headers, json), signal };
    if (json) init.body = JSON.stringify(call.body);
    if (this.#options.credentials !== undefined) init.credentials = this.#options.credentials;
    try {
      return await this.#fetch(this.url(call.path, call.query), init);
    } catch (error) {
      call.signal?.throwIfAborted();
      const why = signal.aborted ? String(signal.reason?.message ?? signal.reason) : String(error);
      throw new ConnectionError(`${call.method} ${call.path}: ${why}`, { cause: error });
    }
  }

  /** A call's JSON answer (2xx), retried as `retry` allows; else the typed error of the answer. */
  async send<T>(call: Call): Promise<T> {
    let failures = 0;
    for (;;) {
      const link = linkSignals(call.signal, call.timeoutMs ?? this.timeoutMs);
      let response: Response;
      let text: string;
      try {
        response = await this.fetch(call, link.signal);
        text = await readText(response, call, link.signal);
      } catch (error) {
        failures += 1;
        if (!(error instanceof ConnectionError) || !call.idempotent || failures >= this.retry.attempts) throw error;
        await sleep(backoff(this.retry, failures), call.signal);
        continue;
      } finally {
        link.dispose();
      }
      if (response.ok) return (text ? JSON.parse(text) : null) as T;
      const error = errorFrom(response.status, response.headers, text, response.statusText);
      if (!TRANSIENT.has(response.status) || !call.idempotent) throw error;
      failures += 1;
      const wait = (error.retryAfter ?? 0) * 1000;
      if (failures >= this.retry.attempts || wait > this.retry.capMs) throw error;
      await sleep(Math.max(backoff(this.retry, failures), wait), call.signal);
    }
  }
}

export async function readText(response: Response, call: Call, signal: AbortSignal): Promise<string> {
  try {
    return await response.text();
  } catch (error) {
    call.signal?.throwIfAborted();
    const why = signal.aborted ? String(signal.reason?.message ?? signal.reason) : String(error);
    throw new ConnectionError(`${call.method} ${call.path}: the answer was cut: ${why}`, { cause: error });
  }
}

/** The wait after `failures` (>= 1) failures in a row, jittered; the doubling starts at `floorMs`
 *  when that is above `baseMs` (a stream's `retry:`). */
export function backoff(retry: RetryOptions, failures: number, floorMs = 0): number {
  const start = Math.max(retry.baseMs, floorMs);
  return jittered(Math.min(Math.max(retry.capMs, floorMs), start * 2 ** (failures - 1)));
}

// Times a random 1–1.5, so that clients that lost one server do not all come back at once.
export function jittered(ms: number): number {
  return ms * (1 + Math.random() / 2);
}

/** Resolves after `ms`, or at once when `wake` is called; rejects with the signal's reason. */
export function sleep(ms: number, signal?: AbortSignal, wake?: (resolve: () => void) => void): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const done = (): void => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", aborted);
      resolve();
    };
    const aborted = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", aborted, { once: true });
    wake?.(done);
  });
}

/** A signal that aborts with `signal`, or after `timeoutMs` with a ConnectionError as its reason
 *  (AbortSignal.any is not in every browser yet). `dispose` when the request is done. */
export function linkSignals(
  signal: AbortSignal | undefined,
  timeoutMs: number | null,
): { signal: AbortSignal; dispose: () => void } {
  const controller = new AbortController();
  const forward = (): void => controller.abort(signal?.reason);
  if (signal?.aborted) forward();
  signal?.addEventListener("abort", forward, { once: true });
  const timer =
    timeoutMs === null
      ? undefined
      : setTimeout(() => controller.abort(new ConnectionError(`no answer in ${timeoutMs} ms`)), timeoutMs);
  return {
    signal: controller.signal,
    dispose: () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", forward);
    },
  };
}

/** A fresh Idempotency-Key. crypto.randomUUID exists only on secure pages (https, localhost);
 *  getRandomValues everywhere. */
export function newKey(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (byte) => byte.toString(16).padStart(2, "0")).join("");
}

/** Django's CSRF cookie, for `csrfToken` on a page of the same site: `csrfToken: csrfTokenFromCookie`. */
export function csrfTokenFromCookie(name = "csrftoken"): string | null {
  if (typeof document === "undefined") return null;
  for (const part of document.cookie.split(";")) {
    const [key, ...value] = part.trim().split("=");
    if (key === name) return decodeURIComponent(value.join("="));
  }
  return null;
}

export function isAbort(error: unknown, signal?: AbortSignal): boolean {
  return signal?.aborted === true && (error === signal.reason || (error as Error)?.name === "AbortError");
}
