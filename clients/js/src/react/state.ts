// What `useRun` shows of a run, rebuilt from its log (docs/design/clients.md#react): a pure
// reducer, so the same events give the same state whether they arrive live, after a reload or
// after a reconnect. `text` is the concatenation of the `output.delta` texts
// (docs/design/execution.md#partial-output says the same rule).
import { deltaText, terminalStatus, type Run, type RunEvent, type RunStatus } from "../models.js";
import type { ConnectionState } from "../stream.js";

export interface RunState {
  /** The run as last read: at mount, after each command, and once it ended. */
  run: Run | null;
  /** Every event delivered, in seq order, each once (from `afterSeq` on). */
  events: RunEvent[];
  /** The text of its `output.delta` events, joined. */
  text: string;
  /** Its status as the newest of what was read and what the events say. */
  status: RunStatus | null;
  connection: ConnectionState;
  /** The last failure: a refusal of the stream, a read or a command that failed. */
  error: Error | null;
  /** The seq of the last event in `events` (the cursor to keep, to resume from later). */
  lastSeq: number;
  /** The seq `status` is known at: a read's `last_seq`, or the event that changed it. */
  statusSeq: number;
}

export type RunAction =
  | { type: "run"; run: Run }
  | { type: "events"; events: readonly RunEvent[] }
  | { type: "connection"; connection: ConnectionState }
  | { type: "error"; error: Error | null };

export function initialRunState(afterSeq = 0): RunState {
  return {
    run: null,
    events: [],
    text: "",
    status: null,
    connection: { state: "connecting" },
    error: null,
    lastSeq: afterSeq,
    statusSeq: -1,
  };
}

// The lifecycle events that change a run's status (runs/events.py, docs/design/states.md).
const STATUS_OF: Record<string, RunStatus> = {
  "run.created": "queued",
  "run.started": "running",
  "run.waiting": "waiting",
  "run.resumed": "queued",
  "run.requeued": "queued",
};

/** The status a run is in right after `event`, or null when the event does not change it. */
export function statusAfter(event: Pick<RunEvent, "type">): RunStatus | null {
  return terminalStatus(event) ?? STATUS_OF[event.type] ?? null;
}

export function reduceRun(state: RunState, action: RunAction): RunState {
  switch (action.type) {
    case "run": {
      const run = action.run;
      // A read older than what the events already said does not move the status back.
      if (run.last_seq < state.statusSeq) return { ...state, run };
      return { ...state, run, status: run.status, statusSeq: run.last_seq };
    }
    case "events": {
      const fresh: RunEvent[] = [];
      let last = state.lastSeq;
      for (const event of action.events) {
        if (event.seq > last) {
          fresh.push(event);
          last = event.seq;
        }
      }
      if (fresh.length === 0) return state;
      let { status, statusSeq } = state;
      for (const event of fresh) {
        const after = statusAfter(event);
        if (after !== null && event.seq >= statusSeq) {
          status = after;
          statusSeq = event.seq;
        }
      }
      return {
        ...state,
        events: [...state.events, ...fresh],
        text: state.text + fresh.map(deltaText).join(""),
        lastSeq: last,
        status,
        statusSeq,
      };
    }
    case "connection":
      return { ...state, connection: action.connection };
    case "error":
      return { ...state, error: action.error };
  }
}
