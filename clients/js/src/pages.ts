// A list read page by page (docs/design/api.md#paging): each page's `next` is followed, so every
// item that matched when the first page was read comes once, whatever is created or ends meanwhile.
import type { Query, Transport } from "./http.js";
import type { Page } from "./models.js";

export class Pages<T> implements AsyncIterable<T> {
  readonly #transport: Transport;
  readonly #path: string;
  readonly #query: Query;
  readonly #signal: AbortSignal | undefined;

  constructor(transport: Transport, path: string, query: Query, signal?: AbortSignal) {
    this.#transport = transport;
    this.#path = path;
    this.#query = query;
    this.#signal = signal;
  }

  /** Every page, fetched as you iterate. */
  async *pages(): AsyncGenerator<Page<T>, void, undefined> {
    let query: Query | null = this.#query;
    while (query !== null) {
      const call = { method: "GET", path: this.#path, query, idempotent: true, signal: this.#signal };
      const page: Page<T> = await this.#transport.send<Page<T>>(call);
      yield page;
      // The next page's query is `next`'s, sent to this client's server: its scheme and host are
      // the server's view of itself, which a proxy between us may not share.
      query = page.next === null ? null : Object.fromEntries(new URL(page.next, "http://next.invalid").searchParams);
    }
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    for await (const page of this.pages()) yield* page.results;
  }

  /** Every item of every page. */
  async toArray(): Promise<T[]> {
    const items: T[] = [];
    for await (const item of this) items.push(item);
    return items;
  }
}
