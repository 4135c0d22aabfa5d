// @runledger/client: the Runledger API from TypeScript, in a browser or Node ≥ 20
// (docs/design/clients.md#js). The React hook is the `@runledger/client/react` entry.
export { Agents, Client, type RequestOptions } from "./client.js";
export {
  APIError,
  AuthenticationError,
  BudgetExhausted,
  Conflict,
  ConnectionError,
  DatabaseUnavailable,
  IdempotencyMismatch,
  InvalidTransition,
  MethodNotAllowed,
  NotFound,
  PayloadTooLarge,
  PermissionDenied,
  RunledgerError,
  StaleTicket,
  TimeoutError,
  TooManyRequests,
  UnsupportedMediaType,
  ValidationError,
  type APIErrorInit,
} from "./errors.js";
export { csrfTokenFromCookie, DEFAULT_RETRY, type ClientOptions, type RetryOptions } from "./http.js";
export {
  deltaText,
  isTerminal,
  TERMINAL_EVENTS,
  TERMINAL_STATUSES,
  terminalStatus,
  type Agent,
  type ApiPath,
  type Attempt,
  type ConflictBody,
  type ErrorBody,
  type EventPage,
  type Page,
  type Run,
  type RunEvent,
  type RunListItem,
  type RunStatus,
  type StopCode,
  type TerminalEventType,
  type Usage,
  type WaitedRun,
} from "./models.js";
export { Pages } from "./pages.js";
export type {
  CallOptions,
  CreateOptions,
  EventsOptions,
  RerunOptions,
  RunFilters,
  Runs,
  RunSettings,
  WaitOptions,
} from "./runs.js";
export { RunStream, wakeOnReturn, type ConnectionState, type StreamOptions, type StreamState } from "./stream.js";
export { SSEDecoder, type Frame } from "./sse.js";
