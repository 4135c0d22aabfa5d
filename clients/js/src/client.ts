// The Runledger API from a browser or Node ≥ 20 (docs/design/clients.md#js): `client.runs`,
// `client.agents`, and `request()` for the rest, on the platform's own fetch.
import { Transport, type ClientOptions, type Query } from "./http.js";
import type { Agent } from "./models.js";
import { Pages } from "./pages.js";
import { Runs, type CallOptions } from "./runs.js";

/** `client.agents`: the agents a run may name. */
export class Agents {
  readonly #transport: Transport;

  constructor(transport: Transport) {
    this.#transport = transport;
  }

  /** Every registered agent, by name, with the event types of its own it declared. */
  list(options: CallOptions & { pageSize?: number | undefined } = {}): Pages<Agent> {
    return new Pages(this.#transport, "/api/agents/", { page_size: options.pageSize }, options.signal);
  }
}

export interface RequestOptions extends CallOptions {
  query?: Query | undefined;
  /** Sent as JSON. */
  body?: unknown;
  headers?: Record<string, string> | undefined;
  /** Safe to send again after a failure (default: GET, HEAD and OPTIONS are). */
  idempotent?: boolean | undefined;
}

/**
 * `new Client({ baseUrl, token })` for a program or an app with an API token;
 * `new Client({ baseUrl: "", credentials: "same-origin", csrfToken: csrfTokenFromCookie })` on a
 * page of the site that serves Runledger, with the browser's session.
 *
 * Every request that is safe to repeat is retried on connection errors and 502/503/504; errors
 * are thrown as the class of their code (`NotFound`, `Conflict` with the committed run, …).
 */
export class Client {
  readonly runs: Runs;
  readonly agents: Agents;
  readonly #transport: Transport;

  constructor(options: ClientOptions) {
    this.#transport = new Transport(options);
    this.runs = new Runs(this.#transport);
    this.agents = new Agents(this.#transport);
  }

  get baseUrl(): string {
    return this.#transport.baseUrl;
  }

  /** Any API request: the decoded JSON of a 2xx answer, else the typed error. */
  request<T = unknown>(method: string, path: string, options: RequestOptions = {}): Promise<T> {
    const upper = method.toUpperCase();
    const idempotent = options.idempotent ?? ["GET", "HEAD", "OPTIONS"].includes(upper);
    const { signal, query, body, headers } = options;
    return this.#transport.send<T>({ method: upper, path, query, body, headers, idempotent, signal });
  }
}
