// What the API answers and takes, named from the OpenAPI schema the server serves: src/schema.ts is
// generated from clients/js/openapi.json at every build (`npm run types`), and a test compares that
// file with the schema a live server serves (tests/client/test_js_schema.py). The objects keep the API's
// field names (`last_seq`, `created_at`), as the JSON pages and the stored log have them.
import type { components, operations, paths } from "./schema.js";

type Schemas = components["schemas"];

/** A run as `GET /api/runs/{id}/` answers it (docs/design/api.md#run-json). */
export type Run = Schemas["RunOutput"];
/** A run in a list: big values left out (`truncated` names them). */
export type RunListItem = Schemas["RunListItem"];
export type RunStatus = Schemas["RunStatusEnum"];
export type Attempt = Schemas["AttemptOutput"];
export type Usage = Schemas["Usage"];
/** One event of a run (docs/design/events.md#event-object): the stream's `data:`, a page's item. */
export type RunEvent = Schemas["EventOutput"];
/** A JSON page of a run's events (docs/design/streaming.md#json-pages). */
export type EventPage = Schemas["RunEventsPage"];
export type Agent = Schemas["Agent"];
/** A run as the server's wait answers it: the run, and why the wait ended. */
export type WaitedRun = operations["runs_wait"]["responses"][200]["content"]["application/json"];
/** A stop's end code: `staff` (the default), `policy`, `budget_exhausted` or `deadline_exceeded`. */
export type StopCode = Schemas["CodeEnum"];
export type CreateRunBody = Schemas["RunCreateInputRequest"];
export type RerunBody = Schemas["RunRerunInputRequest"];
export type StopBody = Schemas["RunStopInputRequest"];
export type CancelBody = Schemas["RunCancelInputRequest"];
export type ResumeBody = Schemas["RunResumeInputRequest"];
/** The API's one error shape (docs/design/api.md#errors); a 409's carries the run too. */
export type ErrorBody = Schemas["Error"];
export type ConflictBody = Schemas["Conflict"];
/** Every path the schema names, as the standalone site mounts the app. */
export type ApiPath = keyof paths;

/** A page of a list (runs, agents): follow `next` until it is null (docs/design/api.md#paging). */
export interface Page<T> {
  next: string | null;
  previous: string | null;
  results: T[];
}

// The terminal event of each terminal status (runs/events.py): always a run's last event.
export const TERMINAL_EVENTS = {
  "run.completed": "completed",
  "run.failed": "failed",
  "run.cancelled": "cancelled",
  "run.stopped": "stopped",
} as const satisfies Record<string, RunStatus>;

export type TerminalEventType = keyof typeof TERMINAL_EVENTS;

export const TERMINAL_STATUSES: readonly RunStatus[] = Object.values(TERMINAL_EVENTS);

/** The status a terminal event ends its run in; null for any other event. */
export function terminalStatus(event: Pick<RunEvent, "type">): RunStatus | null {
  return Object.hasOwn(TERMINAL_EVENTS, event.type) ? TERMINAL_EVENTS[event.type as TerminalEventType] : null;
}

export function isTerminal(status: RunStatus | string | null | undefined): boolean {
  return TERMINAL_STATUSES.includes(status as RunStatus);
}

/** The text of an `output.delta` event (its `data.text`), else "". */
export function deltaText(event: Pick<RunEvent, "type" | "data">): string {
  const text = event.type === "output.delta" ? event.data["text"] : undefined;
  return typeof text === "string" ? text : "";
}
