// @runledger/client 0.1.0: the package's browser build (the global `Runledger`), from clients/js/src.
// Generated, do not edit: `npm run build:static` in clients/js writes it anew.
"use strict";
var Runledger = (() => {
  var __defProp = Object.defineProperty;
  var __getOwnPropDesc = Object.getOwnPropertyDescriptor;
  var __getOwnPropNames = Object.getOwnPropertyNames;
  var __hasOwnProp = Object.prototype.hasOwnProperty;
  var __typeError = (msg) => {
    throw TypeError(msg);
  };
  var __defNormalProp = (obj, key, value) => key in obj ? __defProp(obj, key, { enumerable: true, configurable: true, writable: true, value }) : obj[key] = value;
  var __export = (target, all) => {
    for (var name in all)
      __defProp(target, name, { get: all[name], enumerable: true });
  };
  var __copyProps = (to, from, except, desc) => {
    if (from && typeof from === "object" || typeof from === "function") {
      for (let key of __getOwnPropNames(from))
        if (!__hasOwnProp.call(to, key) && key !== except)
          __defProp(to, key, { get: () => from[key], enumerable: !(desc = __getOwnPropDesc(from, key)) || desc.enumerable });
    }
    return to;
  };
  var __toCommonJS = (mod) => __copyProps(__defProp({}, "__esModule", { value: true }), mod);
  var __publicField = (obj, key, value) => __defNormalProp(obj, typeof key !== "symbol" ? key + "" : key, value);
  var __accessCheck = (obj, member, msg) => member.has(obj) || __typeError("Cannot " + msg);
  var __privateGet = (obj, member, getter) => (__accessCheck(obj, member, "read from private field"), getter ? getter.call(obj) : member.get(obj));
  var __privateAdd = (obj, member, value) => member.has(obj) ? __typeError("Cannot add the same private member more than once") : member instanceof WeakSet ? member.add(obj) : member.set(obj, value);
  var __privateSet = (obj, member, value, setter) => (__accessCheck(obj, member, "write to private field"), setter ? setter.call(obj, value) : member.set(obj, value), value);
  var __privateMethod = (obj, member, method) => (__accessCheck(obj, member, "access private method"), method);

  // src/index.ts
  var index_exports = {};
  __export(index_exports, {
    APIError: () => APIError,
    Agents: () => Agents,
    AuthenticationError: () => AuthenticationError,
    BudgetExhausted: () => BudgetExhausted,
    Client: () => Client,
    Conflict: () => Conflict,
    ConnectionError: () => ConnectionError,
    DEFAULT_RETRY: () => DEFAULT_RETRY,
    DatabaseUnavailable: () => DatabaseUnavailable,
    IdempotencyMismatch: () => IdempotencyMismatch,
    InvalidTransition: () => InvalidTransition,
    MethodNotAllowed: () => MethodNotAllowed,
    NotFound: () => NotFound,
    Pages: () => Pages,
    PayloadTooLarge: () => PayloadTooLarge,
    PermissionDenied: () => PermissionDenied,
    RunStream: () => RunStream,
    RunledgerError: () => RunledgerError,
    SSEDecoder: () => SSEDecoder,
    StaleTicket: () => StaleTicket,
    TERMINAL_EVENTS: () => TERMINAL_EVENTS,
    TERMINAL_STATUSES: () => TERMINAL_STATUSES,
    TimeoutError: () => TimeoutError,
    TooManyRequests: () => TooManyRequests,
    UnsupportedMediaType: () => UnsupportedMediaType,
    ValidationError: () => ValidationError,
    csrfTokenFromCookie: () => csrfTokenFromCookie,
    deltaText: () => deltaText,
    isTerminal: () => isTerminal,
    terminalStatus: () => terminalStatus
  });

  // src/errors.ts
  var RunledgerError = class extends Error {
    constructor() {
      super(...arguments);
      __publicField(this, "name", "RunledgerError");
    }
  };
  var ConnectionError = class extends RunledgerError {
    constructor() {
      super(...arguments);
      __publicField(this, "name", "ConnectionError");
    }
  };
  var TimeoutError = class extends RunledgerError {
    constructor() {
      super(...arguments);
      __publicField(this, "name", "TimeoutError");
    }
  };
  var APIError = class extends RunledgerError {
    constructor(message, init) {
      super(message);
      __publicField(this, "name", "APIError");
      __publicField(this, "status");
      __publicField(this, "code");
      /** What the server said more: per-field messages of a 400, the limit of a 429, … */
      __publicField(this, "detail");
      /** The committed run, on a 409 (a cancel that lost the race carries the run as it ended). */
      __publicField(this, "run");
      /** Seconds the server asked to wait before trying again (`Retry-After`), if it said. */
      __publicField(this, "retryAfter");
      this.status = init.status;
      this.code = init.code || this.constructor.code || `http_${init.status}`;
      this.detail = init.detail ?? null;
      this.run = init.run ?? null;
      this.retryAfter = init.retryAfter ?? null;
    }
  };
  __publicField(APIError, "code", "");
  var ValidationError = class extends APIError {
    constructor() {
      super(...arguments);
      __publicField(this, "name", "ValidationError");
    }
    /** The messages by field (`{"agent": ["…"]}`), when the server named fields. */
    get fields() {
      const detail = this.detail;
      if (detail === null || typeof detail !== "object" || Array.isArray(detail)) return {};
      const fields = {};
      for (const [name, messages] of Object.entries(detail)) {
        fields[name] = Array.isArray(messages) ? messages.map(String) : [JSON.stringify(messages)];
      }
      return fields;
    }
  };
  __publicField(ValidationError, "code", "validation_error");
  var AuthenticationError = class extends APIError {
    constructor() {
      super(...arguments);
      __publicField(this, "name", "AuthenticationError");
    }
  };
  __publicField(AuthenticationError, "code", "not_authenticated");
  var PermissionDenied = class extends APIError {
    constructor() {
      super(...arguments);
      __publicField(this, "name", "PermissionDenied");
    }
  };
  __publicField(PermissionDenied, "code", "permission_denied");
  var NotFound = class extends APIError {
    constructor() {
      super(...arguments);
      __publicField(this, "name", "NotFound");
    }
  };
  __publicField(NotFound, "code", "not_found");
  var MethodNotAllowed = class extends APIError {
    constructor() {
      super(...arguments);
      __publicField(this, "name", "MethodNotAllowed");
    }
  };
  __publicField(MethodNotAllowed, "code", "method_not_allowed");
  var Conflict = class extends APIError {
    constructor() {
      super(...arguments);
      __publicField(this, "name", "Conflict");
    }
  };
  var InvalidTransition = class extends Conflict {
    constructor() {
      super(...arguments);
      __publicField(this, "name", "InvalidTransition");
    }
  };
  __publicField(InvalidTransition, "code", "invalid_transition");
  var StaleTicket = class extends Conflict {
    constructor() {
      super(...arguments);
      __publicField(this, "name", "StaleTicket");
    }
  };
  __publicField(StaleTicket, "code", "stale_ticket");
  var BudgetExhausted = class extends Conflict {
    constructor() {
      super(...arguments);
      __publicField(this, "name", "BudgetExhausted");
    }
  };
  __publicField(BudgetExhausted, "code", "budget_exhausted");
  var PayloadTooLarge = class extends APIError {
    constructor() {
      super(...arguments);
      __publicField(this, "name", "PayloadTooLarge");
    }
  };
  __publicField(PayloadTooLarge, "code", "payload_too_large");
  var UnsupportedMediaType = class extends APIError {
    constructor() {
      super(...arguments);
      __publicField(this, "name", "UnsupportedMediaType");
    }
  };
  __publicField(UnsupportedMediaType, "code", "unsupported_media_type");
  var IdempotencyMismatch = class extends APIError {
    constructor() {
      super(...arguments);
      __publicField(this, "name", "IdempotencyMismatch");
    }
  };
  __publicField(IdempotencyMismatch, "code", "idempotency_mismatch");
  var TooManyRequests = class extends APIError {
    constructor() {
      super(...arguments);
      __publicField(this, "name", "TooManyRequests");
    }
  };
  __publicField(TooManyRequests, "code", "too_many_requests");
  var DatabaseUnavailable = class extends APIError {
    constructor() {
      super(...arguments);
      __publicField(this, "name", "DatabaseUnavailable");
    }
  };
  __publicField(DatabaseUnavailable, "code", "database_unavailable");
  var BY_CODE = Object.fromEntries(
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
      DatabaseUnavailable
    ].map((cls) => [cls.code, cls])
  );
  var BY_STATUS = {
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
    503: DatabaseUnavailable
  };
  function retryAfter(headers) {
    const value = headers.get("Retry-After");
    if (value === null || value.trim() === "") return null;
    const seconds = Number(value);
    if (Number.isFinite(seconds)) return Math.max(0, seconds);
    const when = Date.parse(value);
    return Number.isNaN(when) ? null : Math.max(0, (when - Date.now()) / 1e3);
  }
  function errorFrom(status, headers, text, statusText = "") {
    let body = null;
    try {
      body = JSON.parse(text);
    } catch {
    }
    const error = isObject(body) && isObject(body["error"]) ? body["error"] : null;
    const wait = retryAfter(headers);
    if (error === null) {
      const cls2 = BY_STATUS[status] ?? APIError;
      return new cls2(text.trim().slice(0, 200) || statusText || `HTTP ${status}`, { status, retryAfter: wait });
    }
    const code = typeof error["code"] === "string" ? error["code"] : "";
    const cls = BY_CODE[code] ?? BY_STATUS[status] ?? APIError;
    const run = isObject(body) && isObject(body["run"]) ? body["run"] : null;
    const message = typeof error["message"] === "string" && error["message"] ? error["message"] : code;
    return new cls(message, { status, code, detail: error["detail"], run, retryAfter: wait });
  }
  function isObject(value) {
    return value !== null && typeof value === "object" && !Array.isArray(value);
  }

  // src/http.ts
  var DEFAULT_RETRY = { attempts: 5, streamAttempts: Infinity, baseMs: 200, capMs: 5e3 };
  var TRANSIENT = /* @__PURE__ */ new Set([502, 503, 504]);
  var SAFE_METHODS = /* @__PURE__ */ new Set(["GET", "HEAD", "OPTIONS"]);
  var _options, _fetch;
  var Transport = class {
    constructor(options) {
      __publicField(this, "baseUrl");
      __publicField(this, "retry");
      __publicField(this, "timeoutMs");
      __publicField(this, "streamTimeoutMs");
      __privateAdd(this, _options);
      __privateAdd(this, _fetch);
      if (typeof options?.baseUrl !== "string") throw new TypeError('Client needs a baseUrl ("" for this site)');
      __privateSet(this, _options, options);
      this.baseUrl = options.baseUrl.replace(/\/+$/, "");
      this.retry = { ...DEFAULT_RETRY, ...options.retry };
      this.timeoutMs = options.timeoutMs ?? 3e4;
      this.streamTimeoutMs = options.streamTimeoutMs ?? 6e4;
      const given2 = options.fetch ?? globalThis.fetch;
      if (typeof given2 !== "function") throw new TypeError("no fetch: give Client a `fetch`");
      __privateSet(this, _fetch, (input, init) => given2(input, init));
    }
    url(path, query) {
      const params = new URLSearchParams();
      for (const [name, value] of Object.entries(query ?? {})) {
        if (value !== void 0 && value !== null) params.append(name, String(value));
      }
      const search = params.toString();
      return this.baseUrl + path + (search ? `?${search}` : "");
    }
    headers(method, extra, json = false) {
      const headers = new Headers({ Accept: "application/json", ...__privateGet(this, _options).headers, ...extra });
      if (json) headers.set("Content-Type", "application/json");
      if (__privateGet(this, _options).token) headers.set("Authorization", `Token ${__privateGet(this, _options).token}`);
      if (!SAFE_METHODS.has(method)) {
        const csrf = __privateGet(this, _options).csrfToken;
        const value = typeof csrf === "function" ? csrf() : csrf;
        if (value) headers.set("X-CSRFToken", value);
      }
      return headers;
    }
    /** One request, no retry, aborted by `signal` (the call's own, a timeout's, a stream's): the
     *  answer whatever its status. Throws the call's abort, or ConnectionError. */
    async fetch(call, signal) {
      const json = call.body !== void 0;
      const init = { method: call.method, headers: this.headers(call.method, call.headers, json), signal };
      if (json) init.body = JSON.stringify(call.body);
      if (__privateGet(this, _options).credentials !== void 0) init.credentials = __privateGet(this, _options).credentials;
      try {
        return await __privateGet(this, _fetch).call(this, this.url(call.path, call.query), init);
      } catch (error) {
        call.signal?.throwIfAborted();
        const why = signal.aborted ? String(signal.reason?.message ?? signal.reason) : String(error);
        throw new ConnectionError(`${call.method} ${call.path}: ${why}`, { cause: error });
      }
    }
    /** A call's JSON answer (2xx), retried as `retry` allows; else the typed error of the answer. */
    async send(call) {
      let failures = 0;
      for (; ; ) {
        const link = linkSignals(call.signal, call.timeoutMs ?? this.timeoutMs);
        let response;
        let text;
        try {
          response = await this.fetch(call, link.signal);
          text = await readText(response, call, link.signal);
        } catch (error2) {
          failures += 1;
          if (!(error2 instanceof ConnectionError) || !call.idempotent || failures >= this.retry.attempts) throw error2;
          await sleep(backoff(this.retry, failures), call.signal);
          continue;
        } finally {
          link.dispose();
        }
        if (response.ok) return text ? JSON.parse(text) : null;
        const error = errorFrom(response.status, response.headers, text, response.statusText);
        if (!TRANSIENT.has(response.status) || !call.idempotent) throw error;
        failures += 1;
        const wait = (error.retryAfter ?? 0) * 1e3;
        if (failures >= this.retry.attempts || wait > this.retry.capMs) throw error;
        await sleep(Math.max(backoff(this.retry, failures), wait), call.signal);
      }
    }
  };
  _options = new WeakMap();
  _fetch = new WeakMap();
  async function readText(response, call, signal) {
    try {
      return await response.text();
    } catch (error) {
      call.signal?.throwIfAborted();
      const why = signal.aborted ? String(signal.reason?.message ?? signal.reason) : String(error);
      throw new ConnectionError(`${call.method} ${call.path}: the answer was cut: ${why}`, { cause: error });
    }
  }
  function backoff(retry, failures, floorMs = 0) {
    const start = Math.max(retry.baseMs, floorMs);
    return jittered(Math.min(Math.max(retry.capMs, floorMs), start * 2 ** (failures - 1)));
  }
  function jittered(ms) {
    return ms * (1 + Math.random() / 2);
  }
  function sleep(ms, signal, wake) {
    return new Promise((resolve, reject) => {
      if (signal?.aborted) {
        reject(signal.reason);
        return;
      }
      const done = () => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", aborted);
        resolve();
      };
      const aborted = () => {
        clearTimeout(timer);
        reject(signal?.reason);
      };
      const timer = setTimeout(done, ms);
      signal?.addEventListener("abort", aborted, { once: true });
      wake?.(done);
    });
  }
  function linkSignals(signal, timeoutMs) {
    const controller = new AbortController();
    const forward = () => controller.abort(signal?.reason);
    if (signal?.aborted) forward();
    signal?.addEventListener("abort", forward, { once: true });
    const timer = timeoutMs === null ? void 0 : setTimeout(() => controller.abort(new ConnectionError(`no answer in ${timeoutMs} ms`)), timeoutMs);
    return {
      signal: controller.signal,
      dispose: () => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", forward);
      }
    };
  }
  function newKey() {
    const bytes = crypto.getRandomValues(new Uint8Array(16));
    return Array.from(bytes, (byte) => byte.toString(16).padStart(2, "0")).join("");
  }
  function csrfTokenFromCookie(name = "csrftoken") {
    if (typeof document === "undefined") return null;
    for (const part of document.cookie.split(";")) {
      const [key, ...value] = part.trim().split("=");
      if (key === name) return decodeURIComponent(value.join("="));
    }
    return null;
  }

  // src/pages.ts
  var _transport, _path, _query, _signal;
  var Pages = class {
    constructor(transport, path, query, signal) {
      __privateAdd(this, _transport);
      __privateAdd(this, _path);
      __privateAdd(this, _query);
      __privateAdd(this, _signal);
      __privateSet(this, _transport, transport);
      __privateSet(this, _path, path);
      __privateSet(this, _query, query);
      __privateSet(this, _signal, signal);
    }
    /** Every page, fetched as you iterate. */
    async *pages() {
      let query = __privateGet(this, _query);
      while (query !== null) {
        const call = { method: "GET", path: __privateGet(this, _path), query, idempotent: true, signal: __privateGet(this, _signal) };
        const page = await __privateGet(this, _transport).send(call);
        yield page;
        query = page.next === null ? null : Object.fromEntries(new URL(page.next, "http://next.invalid").searchParams);
      }
    }
    async *[Symbol.asyncIterator]() {
      for await (const page of this.pages()) yield* page.results;
    }
    /** Every item of every page. */
    async toArray() {
      const items = [];
      for await (const item of this) items.push(item);
      return items;
    }
  };
  _transport = new WeakMap();
  _path = new WeakMap();
  _query = new WeakMap();
  _signal = new WeakMap();

  // src/models.ts
  var TERMINAL_EVENTS = {
    "run.completed": "completed",
    "run.failed": "failed",
    "run.cancelled": "cancelled",
    "run.stopped": "stopped"
  };
  var TERMINAL_STATUSES = Object.values(TERMINAL_EVENTS);
  function terminalStatus(event) {
    return Object.hasOwn(TERMINAL_EVENTS, event.type) ? TERMINAL_EVENTS[event.type] : null;
  }
  function isTerminal(status) {
    return TERMINAL_STATUSES.includes(status);
  }
  function deltaText(event) {
    const text = event.type === "output.delta" ? event.data["text"] : void 0;
    return typeof text === "string" ? text : "";
  }

  // src/sse.ts
  var _text, _buffer, _afterCR, _id, _event, _data;
  var SSEDecoder = class {
    constructor() {
      /** The last `retry:` the stream sent (ms), if any. */
      __publicField(this, "retry", null);
      __privateAdd(this, _text, new TextDecoder("utf-8"));
      __privateAdd(this, _buffer, "");
      __privateAdd(this, _afterCR, false);
      __privateAdd(this, _id, null);
      __privateAdd(this, _event, "");
      __privateAdd(this, _data, []);
    }
    /** The frames `chunk` completes. */
    feed(chunk) {
      let text = __privateGet(this, _text).decode(chunk, { stream: true });
      if (text === "") return [];
      if (__privateGet(this, _afterCR) && text.startsWith("\n")) text = text.slice(1);
      __privateSet(this, _afterCR, text.endsWith("\r"));
      const lines = (__privateGet(this, _buffer) + text).replace(/\r\n?/g, "\n").split("\n");
      __privateSet(this, _buffer, lines.pop() ?? "");
      const frames = [];
      for (const line of lines) {
        if (line === "") {
          if (__privateGet(this, _data).length > 0) frames.push({ id: __privateGet(this, _id), event: __privateGet(this, _event) || "message", data: __privateGet(this, _data).join("\n") });
          __privateSet(this, _id, null);
          __privateSet(this, _event, "");
          __privateSet(this, _data, []);
          continue;
        }
        const colon = line.indexOf(":");
        if (colon === 0) continue;
        const name = colon === -1 ? line : line.slice(0, colon);
        let value = colon === -1 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (name === "data") __privateGet(this, _data).push(value);
        else if (name === "id" && !value.includes("\0")) __privateSet(this, _id, value);
        else if (name === "event") __privateSet(this, _event, value);
        else if (name === "retry" && /^\d+$/.test(value)) this.retry = Number(value);
      }
      return frames;
    }
  };
  _text = new WeakMap();
  _buffer = new WeakMap();
  _afterCR = new WeakMap();
  _id = new WeakMap();
  _event = new WeakMap();
  _data = new WeakMap();

  // src/stream.ts
  var TRANSIENT2 = /* @__PURE__ */ new Set([429, 502, 503, 504]);
  var REASONS = {
    401: "not signed in (401)",
    403: "not allowed (403)",
    404: "no such run (404)"
  };
  function typesParam(types) {
    if (types === void 0) return void 0;
    const joined = typeof types === "string" ? types : types.join(",");
    return joined === "" ? void 0 : joined;
  }
  var _transport2, _types, _onState, _stop, _signal2, _cursor, _connection, _open, _wake, _lastByteAt, _started, _texts, _aborted, _RunStream_instances, report_fn, finished_fn, events_fn, refuse_fn, connect_fn, read_fn, fill_fn, deliver_fn;
  var RunStream = class {
    constructor(transport, runId, options = {}) {
      __privateAdd(this, _RunStream_instances);
      __publicField(this, "runId");
      /** The run's terminal event, once delivered. */
      __publicField(this, "terminal", null);
      __privateAdd(this, _transport2);
      __privateAdd(this, _types);
      __privateAdd(this, _onState);
      __privateAdd(this, _stop, new AbortController());
      __privateAdd(this, _signal2);
      __privateAdd(this, _cursor);
      __privateAdd(this, _connection, { state: "connecting" });
      __privateAdd(this, _open, null);
      __privateAdd(this, _wake, null);
      __privateAdd(this, _lastByteAt, 0);
      __privateAdd(this, _started, false);
      __privateAdd(this, _texts, []);
      __privateAdd(this, _aborted, () => __privateGet(this, _stop).abort(__privateGet(this, _signal2)?.reason));
      __privateSet(this, _transport2, transport);
      this.runId = runId;
      __privateSet(this, _cursor, options.afterSeq ?? 0);
      __privateSet(this, _types, typesParam(options.types));
      __privateSet(this, _onState, options.onState);
      __privateSet(this, _signal2, options.signal);
      if (options.signal?.aborted) __privateGet(this, _stop).abort(options.signal.reason);
      options.signal?.addEventListener("abort", __privateGet(this, _aborted), { once: true });
    }
    /** `connecting`, `live`, `reconnecting`, `ended` or `refused`. */
    get state() {
      return __privateGet(this, _connection).state;
    }
    /** The state with its detail: the reason of a refusal, the wait before a reconnect, … */
    get connection() {
      return __privateGet(this, _connection);
    }
    /** The seq of the last event delivered: where a new stream would resume. */
    get lastSeq() {
      return __privateGet(this, _cursor);
    }
    /** Ends the iteration and closes the connection. The run goes on. */
    close() {
      __privateGet(this, _stop).abort(new DOMException("the stream was closed", "AbortError"));
    }
    /** Connect now: skips the wait before a reconnect, and drops a connection that has been silent
     *  for more than `maxSilenceMs` (a tab that slept, a network that changed) to open a fresh one. */
    wake(maxSilenceMs = 2e4) {
      if (__privateGet(this, _wake) !== null) __privateGet(this, _wake).call(this);
      else if (__privateGet(this, _open) !== null && this.state === "live" && Date.now() - __privateGet(this, _lastByteAt) > maxSilenceMs) {
        __privateGet(this, _open).abort(new ConnectionError(`silent for more than ${maxSilenceMs} ms`));
      }
    }
    [Symbol.asyncIterator]() {
      if (__privateGet(this, _started)) throw new TypeError("a RunStream is read once: open another with runs.stream()");
      __privateSet(this, _started, true);
      return __privateMethod(this, _RunStream_instances, events_fn).call(this);
    }
    /** Reads the rest; the terminal event (null when the server had nothing more: a 204). */
    async untilEnd() {
      for await (const _ of this) {
      }
      return this.terminal;
    }
    /** Reads the rest; the text of every `output.delta` this stream delivered, joined. */
    async text() {
      await this.untilEnd();
      return __privateGet(this, _texts).join("");
    }
  };
  _transport2 = new WeakMap();
  _types = new WeakMap();
  _onState = new WeakMap();
  _stop = new WeakMap();
  _signal2 = new WeakMap();
  _cursor = new WeakMap();
  _connection = new WeakMap();
  _open = new WeakMap();
  _wake = new WeakMap();
  _lastByteAt = new WeakMap();
  _started = new WeakMap();
  _texts = new WeakMap();
  _aborted = new WeakMap();
  _RunStream_instances = new WeakSet();
  report_fn = function(connection) {
    var _a;
    __privateSet(this, _connection, connection);
    (_a = __privateGet(this, _onState)) == null ? void 0 : _a.call(this, connection);
  };
  finished_fn = function() {
    return this.state === "ended" || this.state === "refused";
  };
  events_fn = async function* () {
    const retry = __privateGet(this, _transport2).retry;
    let failures = 0;
    let retryMs = null;
    try {
      __privateMethod(this, _RunStream_instances, report_fn).call(this, { state: "connecting" });
      while (!__privateGet(this, _stop).signal.aborted) {
        const open = new AbortController();
        const forward = () => open.abort(__privateGet(this, _stop).signal.reason);
        __privateGet(this, _stop).signal.addEventListener("abort", forward, { once: true });
        __privateSet(this, _open, open);
        const decoder = new SSEDecoder();
        let accepted = false;
        let notBeforeMs = 0;
        let lastError;
        try {
          const response = await __privateMethod(this, _RunStream_instances, connect_fn).call(this, open);
          if (response.status === 200 && response.body !== null) {
            accepted = true;
            failures = 0;
            __privateMethod(this, _RunStream_instances, report_fn).call(this, { state: "live" });
            yield* __privateMethod(this, _RunStream_instances, read_fn).call(this, response.body, decoder, open);
            if (__privateMethod(this, _RunStream_instances, finished_fn).call(this)) return;
            lastError = new ConnectionError("the stream ended before the run did");
          } else if (response.status === 204) {
            __privateMethod(this, _RunStream_instances, report_fn).call(this, { state: "ended", status: null, aborted: false });
            return;
          } else {
            const error = errorFrom(response.status, response.headers, await response.text().catch(() => ""));
            if (!TRANSIENT2.has(response.status)) throw __privateMethod(this, _RunStream_instances, refuse_fn).call(this, error);
            lastError = error;
            notBeforeMs = (error.retryAfter ?? 0) * 1e3;
          }
        } catch (error) {
          if (__privateGet(this, _stop).signal.aborted || __privateMethod(this, _RunStream_instances, finished_fn).call(this)) throw error;
          lastError = error;
        } finally {
          __privateGet(this, _stop).signal.removeEventListener("abort", forward);
          open.abort();
          __privateSet(this, _open, null);
          retryMs = decoder.retry ?? retryMs;
        }
        let delayMs;
        if (accepted) {
          delayMs = jittered(retryMs ?? retry.baseMs);
        } else {
          failures += 1;
          if (failures >= retry.streamAttempts) {
            const why = `${failures} connects failed in a row, the last: ${String(lastError)}`;
            throw __privateMethod(this, _RunStream_instances, refuse_fn).call(this, lastError instanceof APIError ? lastError : new ConnectionError(why, { cause: lastError }));
          }
          delayMs = Math.max(backoff(retry, failures, retryMs ?? 0), notBeforeMs);
        }
        __privateMethod(this, _RunStream_instances, report_fn).call(this, { state: "reconnecting", failures, delayMs, error: lastError });
        await sleep(delayMs, __privateGet(this, _stop).signal, (wake) => {
          __privateSet(this, _wake, wake);
        }).finally(() => {
          __privateSet(this, _wake, null);
        });
      }
    } catch (error) {
      if (!__privateGet(this, _stop).signal.aborted || __privateMethod(this, _RunStream_instances, finished_fn).call(this)) throw error;
    } finally {
      __privateGet(this, _signal2)?.removeEventListener("abort", __privateGet(this, _aborted));
      if (!__privateMethod(this, _RunStream_instances, finished_fn).call(this)) __privateMethod(this, _RunStream_instances, report_fn).call(this, { state: "ended", status: null, aborted: true });
    }
  };
  refuse_fn = function(error) {
    const status = error instanceof APIError ? error.status : 0;
    const reason = REASONS[status] ?? (status ? `${error.message} (${status})` : error.message);
    __privateMethod(this, _RunStream_instances, report_fn).call(this, { state: "refused", reason, error });
    return error;
  };
  connect_fn = async function(open) {
    const query = { after_seq: __privateGet(this, _cursor), types: __privateGet(this, _types) };
    const path = `/api/runs/${encodeURIComponent(this.runId)}/stream/`;
    const ms = __privateGet(this, _transport2).timeoutMs;
    const timer = setTimeout(() => open.abort(new ConnectionError(`no answer in ${ms} ms`)), ms);
    try {
      const call = { method: "GET", path, query, headers: { Accept: "text/event-stream" }, idempotent: true };
      return await __privateGet(this, _transport2).fetch({ ...call, signal: __privateGet(this, _stop).signal }, open.signal);
    } finally {
      clearTimeout(timer);
    }
  };
  read_fn = async function* (body, decoder, open) {
    const reader = body.getReader();
    const silence = __privateGet(this, _transport2).streamTimeoutMs;
    try {
      for (; ; ) {
        const timer = setTimeout(() => open.abort(new ConnectionError(`silent for ${silence} ms`)), silence);
        const { value, done } = await reader.read().finally(() => clearTimeout(timer));
        if (done) return;
        __privateSet(this, _lastByteAt, Date.now());
        for (const frame of decoder.feed(value)) {
          if (open.signal.aborted) return;
          if (frame.id === null || !/^\d+$/.test(frame.id)) continue;
          const seq = Number(frame.id);
          if (seq <= __privateGet(this, _cursor)) continue;
          if (seq > __privateGet(this, _cursor) + 1 && __privateGet(this, _types) === void 0) yield* __privateMethod(this, _RunStream_instances, fill_fn).call(this, seq, open.signal);
          if (seq <= __privateGet(this, _cursor)) continue;
          yield __privateMethod(this, _RunStream_instances, deliver_fn).call(this, JSON.parse(frame.data));
          if (this.terminal !== null) return;
        }
      }
    } finally {
      reader.cancel().catch(() => void 0);
    }
  };
  fill_fn = async function* (seq, signal) {
    const path = `/api/runs/${encodeURIComponent(this.runId)}/events/`;
    while (__privateGet(this, _cursor) < seq - 1) {
      const before = __privateGet(this, _cursor);
      const query = { after_seq: before, limit: 1e3 };
      const page = await __privateGet(this, _transport2).send({ method: "GET", path, query, idempotent: true, signal });
      for (const event of page.results) {
        if (signal.aborted) return;
        if (event.seq > __privateGet(this, _cursor) && event.seq < seq) yield __privateMethod(this, _RunStream_instances, deliver_fn).call(this, event);
      }
      if (__privateGet(this, _cursor) === before) throw new ConnectionError(`the events pages have nothing after seq ${before}`);
    }
  };
  deliver_fn = function(event) {
    __privateSet(this, _cursor, event.seq);
    __privateGet(this, _texts).push(deltaText(event));
    const status = terminalStatus(event);
    if (status !== null) {
      this.terminal = event;
      __privateMethod(this, _RunStream_instances, report_fn).call(this, { state: "ended", status, aborted: false });
    }
    return event;
  };

  // src/runs.ts
  var WAIT_MAX_SECONDS = 60;
  function runPath(runId, action = "") {
    return `/api/runs/${encodeURIComponent(runId)}/` + (action ? `${action}/` : "");
  }
  function isoTime(value) {
    return value instanceof Date ? value.toISOString() : value;
  }
  function commaList(value) {
    return value === void 0 || typeof value === "string" ? value : value.join(",");
  }
  function given(fields) {
    return Object.fromEntries(Object.entries(fields).filter(([, value]) => value !== void 0));
  }
  function settings(options) {
    return {
      metadata: options.metadata,
      max_steps: options.maxSteps,
      max_events: options.maxEvents,
      max_attempts: options.maxAttempts,
      deadline: isoTime(options.deadline)
    };
  }
  var _transport3, _Runs_instances, send_fn, serverWait_fn, follow_fn;
  var Runs = class {
    constructor(transport) {
      __privateAdd(this, _Runs_instances);
      __privateAdd(this, _transport3);
      __privateSet(this, _transport3, transport);
    }
    /** Create a run (201). Sent with an `Idempotency-Key` (made here unless given), so a retry after
     *  a lost answer returns the same run instead of making a second one. */
    create(agent, input = {}, options = {}) {
      const body = given({
        agent,
        input,
        ...settings(options),
        parent: options.parent,
        priority: options.priority,
        start_after: isoTime(options.startAfter)
      });
      const headers = { "Idempotency-Key": options.idempotencyKey ?? newKey() };
      return __privateMethod(this, _Runs_instances, send_fn).call(this, "POST", "/api/runs/", options, { body, headers });
    }
    get(runId, options = {}) {
      return __privateMethod(this, _Runs_instances, send_fn).call(this, "GET", runPath(runId), options);
    }
    /** The runs you can see that match `filters`, newest first, fetched page by page as you iterate:
     *  `for await (const run of client.runs.list({ status: "running" }))`, or `.toArray()`. */
    list(filters = {}) {
      const query = {
        status: commaList(filters.status),
        end_code: commaList(filters.endCode),
        agent: filters.agent,
        parent: filters.parent,
        created_after: isoTime(filters.createdAfter),
        created_before: isoTime(filters.createdBefore),
        page_size: filters.pageSize
      };
      for (const [key, value] of Object.entries(filters.metadata ?? {})) query[`metadata.${key}`] = value;
      return new Pages(__privateGet(this, _transport3), "/api/runs/", query, filters.signal);
    }
    /** One JSON page of events with seq > afterSeq; with `types`, only those and the terminal event. */
    events(runId, options = {}) {
      const query = { after_seq: options.afterSeq ?? 0, limit: options.limit, types: typesParam(options.types) };
      return __privateMethod(this, _Runs_instances, send_fn).call(this, "GET", runPath(runId, "events"), options, { query });
    }
    /** The run's events with seq > afterSeq, live, until its terminal event: iterate it with
     *  `for await`. Reconnects by itself after any drop, never delivers a seq twice; reports its
     *  connection (`onState`, `.state`); a 401, 403, 404 or 400 ends it with the typed error. */
    stream(runId, options = {}) {
      return new RunStream(__privateGet(this, _transport3), runId, options);
    }
    /** The run once it is terminal, through the server's wait (a run that waits for a resume is
     *  followed on its stream); with `released`, once its attempt is released too. */
    async wait(runId, options = {}) {
      const deadline = options.timeoutMs === void 0 ? null : Date.now() + options.timeoutMs;
      let run = await __privateMethod(this, _Runs_instances, serverWait_fn).call(this, runId, deadline, options.signal);
      while (!isTerminal(run.status)) {
        if (run.wait_result === "waiting") {
          await __privateMethod(this, _Runs_instances, follow_fn).call(this, runId, run.last_seq, deadline, options.signal);
          run = await this.get(runId, options);
        } else {
          run = await __privateMethod(this, _Runs_instances, serverWait_fn).call(this, runId, deadline, options.signal);
        }
      }
      let interval = 50;
      while (options.released && run.attempt && run.attempt.released_at === null) {
        await sleep(Math.min(interval, remaining(deadline, interval)), options.signal);
        if (deadline !== null && Date.now() >= deadline) throw new TimeoutError("the run's attempt was not released in time");
        interval = Math.min(1e3, interval * 1.5);
        run = await this.get(runId, options);
      }
      return run;
    }
    /** Cancel a queued, running or waiting run; a run already cancelled is returned as it is. A run
     *  that ended otherwise throws InvalidTransition, whose `run` is the committed one. */
    cancel(runId, options = {}) {
      const body = given({ note: options.note });
      return __privateMethod(this, _Runs_instances, send_fn).call(this, "POST", runPath(runId, "cancel"), options, { body });
    }
    /** Stop a run (needs runs.stop_run); `code` staff (default), policy, budget_exhausted or deadline_exceeded. */
    stop(runId, reason, options = {}) {
      const body = given({ reason, code: options.code });
      return __privateMethod(this, _Runs_instances, send_fn).call(this, "POST", runPath(runId, "stop"), options, { body });
    }
    /** Pause: a queued run waits at once; a running one is parked by its worker at its next safe
     *  boundary (the run answered is then still `running`). */
    pause(runId, options = {}) {
      return __privateMethod(this, _Runs_instances, send_fn).call(this, "POST", runPath(runId, "pause"), options);
    }
    /** Resume a waiting run with its `resume_ticket` (safe to retry with the same input). */
    resume(runId, ticket, input, options = {}) {
      const body = { ticket, input: input ?? null };
      return __privateMethod(this, _Runs_instances, send_fn).call(this, "POST", runPath(runId, "resume"), options, { body });
    }
    /** A new run of the ended run's agent, input and budgets (each as `options` says), its
     *  `rerun_of` the original; with `fromSeq`, a fork. Not retried after a lost answer: a second
     *  try would make a second run. */
    rerun(runId, options = {}) {
      const body = given({
        ...settings(options),
        from_seq: options.fromSeq,
        agent: options.agent,
        input: options.input
      });
      return __privateMethod(this, _Runs_instances, send_fn).call(this, "POST", runPath(runId, "rerun"), options, { body, idempotent: false });
    }
  };
  _transport3 = new WeakMap();
  _Runs_instances = new WeakSet();
  send_fn = function(method, path, options, extra = {}) {
    return __privateGet(this, _transport3).send({ method, path, signal: options.signal, idempotent: true, ...extra });
  };
  serverWait_fn = function(runId, deadline, signal) {
    if (deadline !== null && Date.now() >= deadline) return Promise.reject(new TimeoutError(`run ${runId} did not end in time`));
    const seconds = Math.max(1e-3, remaining(deadline, WAIT_MAX_SECONDS * 1e3) / 1e3);
    const query = { timeout: seconds.toFixed(3) };
    const timeoutMs = seconds * 1e3 + __privateGet(this, _transport3).timeoutMs;
    return __privateGet(this, _transport3).send({ method: "GET", path: runPath(runId, "wait"), query, idempotent: true, signal, timeoutMs });
  };
  follow_fn = async function(runId, afterSeq, deadline, signal) {
    const stop = new AbortController();
    const forward = () => stop.abort(signal?.reason);
    signal?.addEventListener("abort", forward, { once: true });
    const timer = deadline === null ? void 0 : setTimeout(() => stop.abort(), remaining(deadline, Infinity));
    try {
      await this.stream(runId, { afterSeq, signal: stop.signal }).untilEnd();
      signal?.throwIfAborted();
      if (deadline !== null && Date.now() >= deadline) throw new TimeoutError(`run ${runId} did not end in time`);
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", forward);
    }
  };
  function remaining(deadline, defaultMs) {
    return deadline === null ? defaultMs : Math.max(0, Math.min(defaultMs, deadline - Date.now()));
  }

  // src/client.ts
  var _transport4;
  var Agents = class {
    constructor(transport) {
      __privateAdd(this, _transport4);
      __privateSet(this, _transport4, transport);
    }
    /** Every registered agent, by name, with the event types of its own it declared. */
    list(options = {}) {
      return new Pages(__privateGet(this, _transport4), "/api/agents/", { page_size: options.pageSize }, options.signal);
    }
  };
  _transport4 = new WeakMap();
  var _transport5;
  var Client = class {
    constructor(options) {
      __publicField(this, "runs");
      __publicField(this, "agents");
      __privateAdd(this, _transport5);
      __privateSet(this, _transport5, new Transport(options));
      this.runs = new Runs(__privateGet(this, _transport5));
      this.agents = new Agents(__privateGet(this, _transport5));
    }
    get baseUrl() {
      return __privateGet(this, _transport5).baseUrl;
    }
    /** Any API request: the decoded JSON of a 2xx answer, else the typed error. */
    request(method, path, options = {}) {
      const upper = method.toUpperCase();
      const idempotent = options.idempotent ?? ["GET", "HEAD", "OPTIONS"].includes(upper);
      const { signal, query, body, headers } = options;
      return __privateGet(this, _transport5).send({ method: upper, path, query, body, headers, idempotent, signal });
    }
  };
  _transport5 = new WeakMap();
  return __toCommonJS(index_exports);
})();
