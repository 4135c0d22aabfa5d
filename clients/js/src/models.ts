// What the API answers and takes, named from the OpenAPI schema the server serves: src/schema.ts is
// generated from clients/js/openapi.json at every build (`npm run types`), and a test compares that
// file with the schema a live server serves (tests/client/test_js_schema.py). The objects keep the API's
// field names (`last_seq`, `created_at`), as the JSON pages and the stored log have them.
import type {
  CodeEnum,
  EventOutput,
  Error as ErrorShape,
  RunEventsPage,
  RunOutput,
  RunStatusEnum as RunStatus,
  operations,
  paths,
} from "./schema.js";

// The schema's types that this package names as the API does, or renames and no more (the build
// exports each schema by its name: `--root-types`). A rename with a doc of its own is declared below
// instead: a doc on a re-export is not shown, TypeScript shows the original's.
export type {
  Agent,
  AttemptOutput as Attempt,
  Conflict as ConflictBody,
  RunCancelInputRequest as CancelBody,
  RunCreateInputRequest as CreateRunBody,
  RunListItem,
  RunRerunInputRequest as RerunBody,
  RunResumeInputRequest as ResumeBody,
  RunStatusEnum as RunStatus,
  RunStopInputRequest as StopBody,
  Usage,
} from "./schema.js";

/** A run as `GET /api/runs/{id}/` answers it (docs/design/api.md#run-json). */
export type Run = RunOutput;
/** One event of a run (docs/design/events.md#event-object): the stream's `data:`, a page's item. */
export type RunEvent = EventOutput;
/** A JSON page of a run's events (docs/design/streaming.md#json-pages). */
export type EventPage = RunEventsPage;
/** A stop's end code: `staff` (the default), `policy`, `budget_exhausted` or `deadline_exceeded`. */
export type StopCode = CodeEnum;
/** The API's one error shape (docs/design/api.md#errors); a 409's carries the run too. */
export type ErrorBody = ErrorShape;
/** A run as the server's wait answers it: the run, and why the wait ended. */
export type WaitedRun = operations["runs_wait"]["responses"][200]["content"]["application/json"];
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
