// @runledger/client/react: a run followed live by a React component (docs/design/clients.md#react).
//
//   const { run, events, text, status, connection, error, cancel, stop, pause, resume } = useRun(runId);
//
// On mount it reads the run and streams its log from the start (or from a cursor the app kept),
// so a reload rebuilds exactly the state it showed; it reconnects by itself, and unmounting only
// disconnects — it never cancels the run. Components showing the same run share one stream.
import { createContext, createElement, useContext, useMemo, useSyncExternalStore, type ReactElement, type ReactNode } from "react";
import type { Client } from "../client.js";
import { runStore, type RunCommands, type RunStoreOptions } from "./store.js";
import { initialRunState, type RunState } from "./state.js";

export { initialRunState, reduceRun, statusAfter, type RunAction, type RunState } from "./state.js";
export { RunStore, runStore, type RunCommands, type RunStoreOptions } from "./store.js";

const ClientContext = createContext<Client | null>(null);

/** Gives `client` to every `useRun` below it. */
export function RunledgerProvider(props: { client: Client; children?: ReactNode }): ReactElement {
  return createElement(ClientContext.Provider, { value: props.client }, props.children);
}

/** The client of the nearest RunledgerProvider. */
export function useClient(): Client {
  const client = useContext(ClientContext);
  if (client === null) throw new Error("no Runledger client: wrap the app in <RunledgerProvider client={…}>");
  return client;
}

export interface UseRunOptions extends RunStoreOptions {
  /** Default: the RunledgerProvider's. */
  client?: Client | undefined;
}

export type UseRunResult = RunState & RunCommands;

const IDLE: RunState = { ...initialRunState(), connection: { state: "ended", status: null, aborted: true } };
const NO_RUN = (): Promise<null> => Promise.resolve(null);
const IDLE_COMMANDS: RunCommands = { cancel: NO_RUN, stop: NO_RUN, pause: NO_RUN, resume: NO_RUN };
const idleSubscribe = (): (() => void) => () => undefined;
const idleSnapshot = (): RunState => IDLE;

/**
 * The run `runId`, live: `run` (as last read), `events` (each once, in seq order), `text` (its
 * `output.delta` texts joined), `status`, `connection` (`connecting`, `live`, `reconnecting`,
 * `ended`, `refused` with its reason), `error`, `lastSeq`, and its commands. No run (null): an idle
 * state whose commands do nothing.
 */
export function useRun(runId: string | null | undefined, options: UseRunOptions = {}): UseRunResult {
  const provided = useContext(ClientContext);
  const client = options.client ?? provided;
  if (client === null) throw new Error("useRun needs a client: <RunledgerProvider client={…}> or useRun(id, { client })");
  const afterSeq = options.afterSeq ?? 0;
  const types = options.types === undefined ? undefined : [options.types].flat().join(",");
  const store = useMemo(
    () => (runId ? runStore(client, runId, { afterSeq, types }) : null),
    [client, runId, afterSeq, types],
  );
  const snapshot = store?.getSnapshot ?? idleSnapshot;
  const state = useSyncExternalStore(store?.subscribe ?? idleSubscribe, snapshot, snapshot);
  const commands = useMemo<RunCommands>(
    () =>
      store === null
        ? IDLE_COMMANDS
        : {
            cancel: (note) => store.cancel(note),
            stop: (reason, code) => store.stop(reason, code),
            pause: () => store.pause(),
            resume: (input, ticket) => store.resume(input, ticket),
          },
    [store],
  );
  return useMemo(() => ({ ...state, ...commands }), [state, commands]);
}
