"""The SSE stream and the wait in the OpenAPI schema (docs/design/api.md#schema).

`run_stream` (views.py) and `run_wait` (wait.py) are plain async Django views (not DRF), so
drf-spectacular does not document them; this postprocessing hook (listed in
`SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]`) adds their operations, at the paths drf-spectacular's
own walk of the URLconf finds them: where the project mounted them, as the DRF endpoints' paths. A
`text/event-stream` body has no JSON schema to fuzz, and a wait lasts up to a minute, so contract
tests leave both paths out.
"""

from collections.abc import Callable
from typing import Any

from django.conf import settings
from drf_spectacular.generators import EndpointEnumerator

from runs.conf import conf
from runs.events import TYPES_HELP, EventType
from runs.streaming import views, wait

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "detail"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "detail": {"nullable": True},
            },
        }
    },
}

_CURSOR = {"type": "integer", "minimum": 0, "format": "int64"}

_RUN_ID = {
    "name": "run_id",
    "in": "path",
    "required": True,
    "description": "The run's id. A malformed id matches no run (404).",
    "schema": {"type": "string", "format": "uuid"},
}


def _error(description: str, example_code: str, error_schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "description": description,
        "content": {
            "application/json": {
                "schema": error_schema,
                "example": {"error": {"code": example_code, "message": description, "detail": None}},
            }
        },
    }


def _operation(error_schema: dict[str, Any], run_schema: dict[str, Any], run_path: str) -> dict[str, Any]:
    retry_ms = conf.SSE_RETRY_MS
    keepalive = conf.SSE_KEEPALIVE_SECONDS
    delta = EventType.OUTPUT_DELTA.value
    example = (
        f"retry: {retry_ms}\n\n"
        f'event: {delta}\ndata: {{"seq":3,"type":"{delta}","data":{{"text":"Hel"}},'
        '"created_at":"2026-01-01T12:00:00.000000Z","attempt":1}\nid: 3\n\n'
        ": keep-alive\n\n"
    )
    return {
        "operationId": "runs_stream_retrieve",
        "summary": "Stream a run's events (Server-Sent Events)",
        "description": (
            "Replays the stored events with `seq` greater than the cursor, in order, then follows new "
            "ones live. Each event is one SSE frame: `event: <type>`, `data: <event JSON>`, `id: <seq>` last "
            f"(the same event object as `GET {run_path}events/`). The cursor is the `Last-Event-ID` "
            "header when given (EventSource sends it on reconnect), else `after_seq`, else 0; "
            "reconnecting with the last received id resumes with no gap and no duplicate.\n\n"
            f"The stream starts with `retry: {retry_ms}` and sends a `: keep-alive` comment every "
            f"{keepalive:g} s while idle. It ends after the run's terminal event. Closing it never "
            "changes the run.\n\n"
            "Browsers authenticate with the session cookie (EventSource cannot send headers), "
            "programs with `Authorization: Token <key>`."
        ),
        "tags": ["runs"],
        "parameters": [
            _RUN_ID,
            {
                "name": "after_seq",
                "in": "query",
                "required": False,
                "description": "Send events with seq greater than this (default 0). Ignored when "
                "`Last-Event-ID` is given, but still validated.",
                "schema": _CURSOR,
            },
            {
                "name": "Last-Event-ID",
                "in": "header",
                "required": False,
                "description": "The id (seq) of the last event received; wins over `after_seq`.",
                "schema": _CURSOR,
            },
            {
                "name": "types",
                "in": "query",
                "required": False,
                "description": f"Send {TYPES_HELP}. Such a stream is served by the web process, not held by the edge.",
                "schema": {"type": "string", "example": f"{delta},run.*"},
            },
        ],
        "responses": {
            "200": {
                "description": "The event stream: replay, then live events until the terminal event.",
                "headers": {
                    "Cache-Control": {"schema": {"type": "string", "example": "no-cache"}},
                    "X-Accel-Buffering": {"schema": {"type": "string", "example": "no"}},
                },
                "content": {"text/event-stream": {"schema": {"type": "string"}, "example": example}},
            },
            "204": {
                "description": "The run has ended and the cursor is at or past its last event: nothing "
                "more will come (EventSource stops reconnecting)."
            },
            "400": _error(
                "A cursor that is not an integer >= 0, or past the last event of a run that has not ended; "
                "an unknown event type in `types`.",
                "validation_error",
                error_schema,
            ),
            **_refusals(error_schema),
        },
    }


def _refusals(error_schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "401": _error("Not authenticated.", "not_authenticated", error_schema),
        "404": _error("No such run, or not visible to the caller.", "not_found", error_schema),
        "429": _error(
            f"The user holds {conf.MAX_STREAMS_PER_USER} streams and waits on this server already (its cap).",
            "too_many_requests",
            error_schema,
        ),
        "503": _error("The database is unavailable.", "database_unavailable", error_schema),
    }


def _wait_operation(error_schema: dict[str, Any], run_schema: dict[str, Any], run_path: str) -> dict[str, Any]:
    results = [member.value for member in wait.WaitResult]
    waited = {
        "type": "object",
        "required": ["wait_result"],
        "properties": {
            "wait_result": {
                "type": "string",
                "enum": results,
                "description": "`ended`: the run is terminal; `waiting`: it waits (paused, or for input) until "
                "a resume; `timeout`: neither within `timeout`, the run as it is.",
            }
        },
    }
    return {
        "operationId": "runs_wait",
        "summary": "Wait for a run to end or wait",
        "description": (
            "Answers as soon as the run is terminal or waiting (at once if it already is), else after "
            f"`timeout` seconds: the run (as `GET {run_path}` answers it) plus `wait_result`. For "
            "programs without an SSE client; ask again after a `timeout`. While it waits it holds no "
            "thread and no database connection on the server, and it counts against the user's cap of "
            "streams (429). A wait that must wait sends its head at once and its body when it ends; one "
            "that cannot answer after all (the database lost, or the caller's sight of the run) leaves its "
            "body unfinished: ask again."
        ),
        "tags": ["runs"],
        "parameters": [
            _RUN_ID,
            {
                "name": "timeout",
                "in": "query",
                "required": False,
                "description": f"Seconds to wait at most: more than 0, at most {wait.MAX_SECONDS:g} "
                f"(default {wait.DEFAULT_SECONDS:g}).",
                "schema": {
                    "type": "number",
                    "minimum": 0,
                    "exclusiveMinimum": True,
                    "maximum": wait.MAX_SECONDS,
                    "default": wait.DEFAULT_SECONDS,
                },
            },
        ],
        "responses": {
            "200": {
                "description": "The run, and why the wait ended.",
                "headers": {"Cache-Control": {"schema": {"type": "string", "example": "no-store"}}},
                "content": {"application/json": {"schema": {"allOf": [run_schema, waited]}}},
            },
            "400": _error("A `timeout` that is not a number in (0, 60].", "validation_error", error_schema),
            "405": _error("A method other than GET.", "method_not_allowed", error_schema),
            **_refusals(error_schema),
        },
    }


class _PlainViews(EndpointEnumerator):
    """drf-spectacular's own walk of the URLconf, which names the DRF endpoints' paths, keeping only
    the views it skips as not DRF's: theirs come out as the project mounted them, like the others."""

    def should_include_endpoint(self, path: str, callback: Callable[..., Any]) -> bool:
        return callback in _OPERATIONS

    def get_allowed_methods(self, callback: Callable[..., Any]) -> list[str]:
        return ["GET"]


# Each plain view's operation, made alike (the stream's has no use for the run's schema).
_OPERATIONS = {views.run_stream: _operation, wait.run_wait: _wait_operation}


def document_run_stream(result: dict[str, Any], generator: Any, **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: add `GET …/runs/{run_id}/stream/` and `…/wait/`, each at
    every path the URLconf the schema describes has it."""
    components = result.setdefault("components", {})
    schemas = components.get("schemas", {})
    # The one error shape: the API's own component when it has one, else the same shape inline.
    error_schema = {"$ref": "#/components/schemas/Error"} if "Error" in schemas else _ERROR
    # The run as its own path documents it, when the schema has that component.
    run_schema = {"$ref": "#/components/schemas/RunOutput"} if "RunOutput" in schemas else {"type": "object"}
    # The schemes spectacular itself derives from DRF's Token and Session authentication, under its
    # own names, so the stream shares them with the DRF endpoints (added if no DRF view has them yet).
    schemes = components.setdefault("securitySchemes", {})
    schemes.setdefault(
        "tokenAuth",
        {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": 'Token-based authentication with required prefix "Token"',
        },
    )
    schemes.setdefault("cookieAuth", {"type": "apiKey", "in": "cookie", "name": settings.SESSION_COOKIE_NAME})
    paths = result.setdefault("paths", {})
    for path, _regex, _method, view in _PlainViews(generator.patterns, generator.urlconf).get_api_endpoints():
        run_path = path.rsplit("/", 2)[0] + "/"  # …/runs/{run_id}/stream/ -> …/runs/{run_id}/
        operation = _OPERATIONS[view](error_schema, run_schema, run_path)
        operation["security"] = [{"tokenAuth": []}, {"cookieAuth": []}]
        paths.setdefault(path, {})["get"] = operation
    return result
