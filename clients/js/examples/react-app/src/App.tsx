import { useState, type FormEvent } from "react";
import { isTerminal, type ConnectionState } from "@runledger/client";
import { useClient, useRun } from "@runledger/client/react";

// The run the page shows is in its URL (?run=<id>): a reload shows the same run, rebuilt from its log.
export function App() {
  const [runId, setRunId] = useState(() => new URLSearchParams(location.search).get("run"));
  const show = (id: string | null) => {
    history.replaceState(null, "", id === null ? location.pathname : `?run=${id}`);
    setRunId(id);
  };
  return runId === null ? <Start onStarted={show} /> : <RunView runId={runId} onDone={() => show(null)} />;
}

function Start({ onStarted }: { onStarted: (runId: string) => void }) {
  const client = useClient();
  const [input, setInput] = useState('{"deltas": 40, "delay_ms": 100}');
  const [error, setError] = useState<Error | null>(null);

  async function start(event: FormEvent) {
    event.preventDefault();
    setError(null);
    try {
      const run = await client.runs.create("demo", JSON.parse(input));
      onStarted(run.id);
    } catch (failure) {
      setError(failure as Error);
    }
  }

  return (
    <form onSubmit={start}>
      <label>
        The demo agent's input
        <textarea id="input" rows={3} value={input} onChange={(event) => setInput(event.target.value)} />
      </label>
      <button id="start">Start a run</button>
      {error && <p id="error" role="alert">{error.name}: {error.message}</p>}
    </form>
  );
}

function RunView({ runId, onDone }: { runId: string; onDone: () => void }) {
  const { text, status, connection, error, events, cancel } = useRun(runId);
  const [stopping, setStopping] = useState(false);

  // Closing the page, or losing the network, only disconnects: the run goes on. Only Stop stops it.
  async function stop() {
    setStopping(true);
    await cancel("stopped from the page");
    setStopping(false);
  }

  return (
    <section id="run" data-status={status ?? ""} data-connection={connection.state}>
      <p>
        Run <code>{runId}</code>: <strong id="status">{status ?? "…"}</strong>, connection{" "}
        <span id="connection">{describe(connection)}</span>
      </p>
      <pre id="text">{text}</pre>
      <button id="stop" onClick={stop} disabled={stopping || !status || isTerminal(status)}>
        Stop
      </button>{" "}
      <button id="another" onClick={onDone}>
        Another run
      </button>
      {error && <p id="error" role="alert">{error.name}: {error.message}</p>}
      {/* Every event the page holds, once each in seq order (a test compares them with the stored log). */}
      <ol id="events" hidden>
        {events.map((event) => (
          <li key={event.seq} data-seq={event.seq} data-type={event.type} />
        ))}
      </ol>
    </section>
  );
}

// connecting, live, reconnecting, ended, or refused with the reason (a 401, 403 or 404 is not retried).
function describe(connection: ConnectionState): string {
  return connection.state === "refused" ? `refused: ${connection.reason}` : connection.state;
}
