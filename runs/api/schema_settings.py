"""The OpenAPI schema's settings, the app's own (docs/design/api.md#schema; runs.api.schema serves the
schema with them). A module of plain data, importable from a settings module: the standalone site
gives them to drf-spectacular's own deploy check too (config/settings.py)."""

from typing import Any

SCHEMA_SETTINGS: dict[str, Any] = {
    "TITLE": "Runledger API",
    "DESCRIPTION": "Durable agent runs: events, streams, cancel, stop, pause and resume.",
    "VERSION": "1.0.0",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {"RunStatusEnum": "runs.api.serializers.RUN_STATUSES"},
    # The app's operations, where the project mounted them: not the project's other APIs.
    "PREPROCESSING_HOOKS": ["runs.api.schema.the_apps_endpoints"],
    # The SSE stream and the wait are plain async views that spectacular skips; the hook documents
    # them where the project mounted them. A site below a path of its own names it in `servers`.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "runs.streaming.schema.document_run_stream",
        "runs.api.schema.served_below_the_script_prefix",
    ],
}
