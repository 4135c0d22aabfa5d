// One error class per error code of the API (docs/design/api.md#errors), as the Python client has
// them, and the one function that turns an error answer into its error. Every error the server
// sends has the shape {"error": {"code", "message", "detail"}}, plus "run" (the committed run) on a
// 409; the class is chosen by `code`, and an answer without one (a proxy's HTML 502) by its status.
import type { Run } from "./models.js";

/** Anything this client throws about the server or the way to it. */
export class RunledgerError extends Error {
  override name = "RunledgerError";
}

/** The server could not be reached, or the connection failed, after the retries allowed. */
export class ConnectionError extends RunledgerError {
  override name = "ConnectionError";
}

/** `runs.wait()` or a stream's deadline passed before the run ended. */
export class TimeoutError extends RunledgerError {
  override name = "TimeoutError";
}

export interface APIErrorInit {
  status: number;
  code?: string | undefined;
  detail?: unknown;
  run?: Run | null | undefined;
  retryAfter?: number | null | undefined;
}

/** The server answered with an error; `code` is the API's error code. */
export class APIError extends RunledgerError {
  override name = "APIError";
  static readonly code: string = "";
  readonly status: number;
  readonly code: string;
  /** What the server said more: per-field messages of a 400, the limit of a 429, … */
  readonly detail: unknown;
  /** The committed run, on a 409 (a cancel that lost the race carries the run as it ended). */
  readonly run: Run | null;
  /** Seconds the server asked to wait before trying again (`Retry-After`), if it said. */
  readonly retryAfter: number | null;

  constructor(message: string, init: APIErrorInit) {
    super(message);
    this.status = init.status;
    this.code = init.code || (this.constructor as typeof APIError).code || `http_${init.status}`;
    this.detail = init.detail ?? null;
    this.run = init.run ?? null;
    this.retryAfter = init.retryAfter ?? null;
  }
}

/** 400: a malformed body, filter or cursor, an unknown agent, an invisible parent. */
export class ValidationError extends APIError {
  override name = "ValidationError";
  static override readonly code = "validation_error";

  /** The messages by field (`{"agent": ["…"]}`), when the server named fields. */
  get fields(): Record<string, string[]> {
    const detail = this.detail;
    if (detail === null || typeof detail !== "object" || Array.isArray(detail)) return {};
    const fields: Record<string, string[]> = {};
    for (const [name, messages] of Object.entries(detail)) {
      fields[name] = Array.isArray(messages) ? messages.map(String) : [JSON.stringify(messages)];
    }
    return fields;
  }
}

/** 401: no credentials, or bad ones (a wrong or revoked token, a session that ended). */
export class AuthenticationError extends APIError {
  override name = "AuthenticationError";
  static override readonly code = "not_authenticated";
}

/** 403: a run the caller sees, an action the caller may not take on it. */
export class PermissionDenied extends APIError {
  override name = "PermissionDenied";
  static override readonly code = "permission_denied";
}

/** 404: no such run, or one the caller cannot see. */
export class NotFound extends APIError {
  override name = "NotFound";
  static override readonly code = "not_found";
}

export class MethodNotAllowed extends APIError {
  override name = "MethodNotAllowed";
  static override readonly code = "method_not_allowed";
}

/** 409: the run's committed state refused the command; `run` is that committed run. */
export class Conflict extends APIError {
  override name = "Conflict";
}

export class InvalidTransition extends Conflict {
  override name = "InvalidTransition";
  static override readonly code = "invalid_transition";
}

/** 409: a resume with a ticket that is not (or no longer) the run's. */
export class StaleTicket extends Conflict {
  override name = "StaleTicket";
  static override readonly code = "stale_ticket";
}

/** 409: a pause or resume whose events would pass the run's `max_events`; nothing was written. */
export class BudgetExhausted extends Conflict {
  override name = "BudgetExhausted";
  static override readonly code = "budget_exhausted";
}

export class PayloadTooLarge extends APIError {
  override name = "PayloadTooLarge";
  static override readonly code = "payload_too_large";
}

export class UnsupportedMediaType extends APIError {
  override name = "UnsupportedMediaType";
  static override readonly code = "unsupported_media_type";
}

/** 422: the Idempotency-Key was used before with another body. */
export class IdempotencyMismatch extends APIError {
  override name = "IdempotencyMismatch";
  static override readonly code = "idempotency_mismatch";
}

/** 429: a limit of the caller's (active runs, open streams); `retryAfter` in seconds, if said. */
export class TooManyRequests extends APIError {
  override name = "TooManyRequests";
  static override readonly code = "too_many_requests";
}

/** 503: the server cannot reach its database; retried by the client before it is thrown. */
export class DatabaseUnavailable extends APIError {
  override name = "DatabaseUnavailable";
  static override readonly code = "database_unavailable";
}

type APIErrorClass = new (message: string, init: APIErrorInit) => APIError;

const BY_CODE: Record<string, APIErrorClass> = Object.fromEntries(
  [
    ValidationError,
    AuthenticationError,
    PermissionDenied,
    NotFound,
    MethodNotAllowed,
    InvalidTransition,
    StaleTicket,
    BudgetExhausted,
    PayloadTooLarge,
    UnsupportedMediaType,
    IdempotencyMismatch,
    TooManyRequests,
    DatabaseUnavailable,
  ].map((cls) => [cls.code, cls]),
);

const BY_STATUS: Record<number, APIErrorClass> = {
  400: ValidationError,
  401: AuthenticationError,
  403: PermissionDenied,
  404: NotFound,
  405: MethodNotAllowed,
  409: Conflict,
  413: PayloadTooLarge,
  415: UnsupportedMediaType,
  422: IdempotencyMismatch,
  429: TooManyRequests,
  503: DatabaseUnavailable,
};

/** The `Retry-After` header in seconds (a number or an HTTP date), if any. */
export function retryAfter(headers: Headers): number | null {
  const value = headers.get("Retry-After");
  if (value === null || value.trim() === "") return null;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return Math.max(0, seconds);
  const when = Date.parse(value);
  return Number.isNaN(when) ? null : Math.max(0, (when - Date.now()) / 1000);
}

/** The error of an answer that is not a success, from its status, headers and body text. */
export function errorFrom(status: number, headers: Headers, text: string, statusText = ""): APIError {
  let body: unknown = null;
  try {
    body = JSON.parse(text);
  } catch {
    // Not JSON: a proxy's page, say. Its status chooses the class.
  }
  const error = isObject(body) && isObject(body["error"]) ? body["error"] : null;
  const wait = retryAfter(headers);
  if (error === null) {
    const cls = BY_STATUS[status] ?? APIError;
    return new cls(text.trim().slice(0, 200) || statusText || `HTTP ${status}`, { status, retryAfter: wait });
  }
  const code = typeof error["code"] === "string" ? error["code"] : "";
  const cls = BY_CODE[code] ?? BY_STATUS[status] ?? APIError;
  const run = isObject(body) && isObject(body["run"]) ? (body["run"] as unknown as Run) : null;
  const message = typeof error["message"] === "string" && error["message"] ? error["message"] : code;
  return new cls(message, { status, code, detail: error["detail"], run, retryAfter: wait });
}

function isObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}
