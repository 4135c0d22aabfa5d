"""Runledger's Python client: `Client` and `AsyncClient` for the REST API and its SSE streams,
which resume by themselves, and the `runledger` command line (runledger_client.cli)."""

from runledger_client._core import ClientOptions, CreateOptions, Retry, RunFilters, __version__
from runledger_client.aio import AsyncClient
from runledger_client.client import Client
from runledger_client.errors import (
    APIError,
    BudgetExhausted,
    Conflict,
    DatabaseUnavailable,
    IdempotencyMismatch,
    InvalidTransition,
    MethodNotAllowed,
    NotAuthenticated,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    RunledgerError,
    StaleTicket,
    TooManyRequests,
    TransportError,
    UnsupportedMediaType,
    ValidationError,
)
from runledger_client.models import TERMINAL_EVENT_TYPES, TERMINAL_STATUSES, Event, EventPage, Run, RunPage

__all__ = [
    "TERMINAL_EVENT_TYPES",
    "TERMINAL_STATUSES",
    "APIError",
    "AsyncClient",
    "BudgetExhausted",
    "Client",
    "ClientOptions",
    "Conflict",
    "CreateOptions",
    "DatabaseUnavailable",
    "Event",
    "EventPage",
    "IdempotencyMismatch",
    "InvalidTransition",
    "MethodNotAllowed",
    "NotAuthenticated",
    "NotFound",
    "PayloadTooLarge",
    "PermissionDenied",
    "Retry",
    "Run",
    "RunFilters",
    "RunPage",
    "RunledgerError",
    "StaleTicket",
    "TooManyRequests",
    "TransportError",
    "UnsupportedMediaType",
    "ValidationError",
    "__version__",
]
