"""The one exception tree of cotenant.

Every error cotenant raises on purpose derives from :class:`CotenantError`; foreign errors
(DuckDB, protobuf, JSON, gRPC, TOML) are translated at the boundary with ``raise ... from exc``
so callers catch one family::

    CotenantError
    ├── ConfigError            a configuration key or value is wrong (names both)
    ├── StoreError             the embedded store cannot be opened or written
    │   └── SchemaVersionError the store file was written by an incompatible version
    ├── IngestError            an incoming telemetry payload cannot be accepted
    │   ├── DecodeError        the body is not valid OTLP (protobuf or JSON)          -> 400
    │   ├── PayloadTooLarge    the body, or its inflated form, exceeds the limit      -> 413
    │   ├── UnsupportedMediaType  the content type or encoding is not OTLP            -> 415
    │   └── Overloaded         the writer queue is full; retry after ``retry_after_s``-> 429/503
    ├── QueryError             a query parameter (time, model, limit) is invalid      -> 400
    │   └── NotFoundError      the named model, incident or action does not exist     -> 404
    ├── NvmlUnavailable        NVML cannot be used here (binding, library or driver missing)
    ├── SourceError            a metric source (Prometheus) is down, too slow, or answers
    │                          something that is not its API (names URL, query, remedy)
    ├── ScenarioError          a simulator scenario file is invalid (names file, field, value)
    ├── FeedError              a simulated-NVML feed (``cotenant simulate --nvml-feed``) has a
    │                          bad header or record (the reader names the file and line)
    ├── TabularError           a tabular case (wide CSV) cannot be read or analysed (names the
    │                          file and what is wrong)
    ├── TraceError             a recorded production trace (GenTD26) cannot be read (names the
    │                          file and what is wrong)
    ├── AuthError              a mutating API call lacks the bearer token
    │   ├── Unauthorized       no token given                                        -> 401
    │   └── Forbidden          a token was given but it is wrong                     -> 403
    ├── ActionError            an action cannot move to the requested state           -> 409
    ├── BackendError           an actuator backend is down, slow or refuses a change
    ├── AlertPayloadError      an Alertmanager webhook body is malformed              -> 400
    ├── ReportError            a weekly report cannot be produced (bad week, no Chromium for PDF)
    └── UsageError             a library API was called wrongly (also a ValueError)

It lives in ``core/`` because ``core`` is the layer every other layer may import.
"""

from __future__ import annotations


class CotenantError(Exception):
    """Base of every error cotenant raises on purpose."""


class ConfigError(CotenantError):
    """A configuration key or value is invalid; the message names the key and the value."""


class StoreError(CotenantError):
    """The embedded store cannot be opened, read or written."""


class SchemaVersionError(StoreError):
    """The store file carries a schema version this release cannot use."""


class IngestError(CotenantError):
    """An incoming payload cannot be accepted."""


class DecodeError(IngestError):
    """The body is not a valid OTLP ExportTraceServiceRequest."""


class PayloadTooLarge(IngestError):
    """The body, or the body once inflated, exceeds the configured limit."""


class UnsupportedMediaType(IngestError):
    """The content type or content encoding is not one OTLP allows."""


class Overloaded(IngestError):
    """The writer queue is full; the client should retry after ``retry_after_s`` seconds."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QueryError(CotenantError):
    """A query parameter is invalid; the message names it."""


class ScenarioError(CotenantError):
    """A scenario file cannot be read or is invalid; the message names the file, the field path
    (e.g. ``models[1].kernel.sm_demand``) and the bad value."""


class FeedError(CotenantError):
    """A simulated-NVML feed file cannot be written, or a header or sample record in it is not
    one; the message names the field (the reader adds the file and line)."""


class TabularError(CotenantError):
    """A tabular case (``data.csv`` with ``time`` and ``<entity>_<metric>`` columns, optional
    ``inject_time.txt``) cannot be read or analysed; the message names the file and what is
    wrong with it."""


class TraceError(CotenantError):
    """A recorded production trace (the GenTD26 folder or one of its files) cannot be read: the
    message names the file and what is wrong with it (missing, not a gzip tar, no CSV member, a
    missing column, off-grid time)."""


class SourceError(CotenantError):
    """A metric source cannot answer: unreachable, timed out, HTTP error, or an answer that is
    not its API. The message names the URL, the query and what to do; ``url`` and ``query``
    hold them in full."""

    def __init__(self, message: str, *, url: str = "", query: str = "") -> None:
        super().__init__(message)
        self.url = url
        self.query = query


class UsageError(CotenantError, ValueError):
    """A library function was called with an invalid argument (e.g. an unknown phase)."""


class NotFoundError(QueryError):
    """The model, incident or action named in a request does not exist."""


class NvmlUnavailable(CotenantError):
    """NVML cannot be used here: binding or library missing, driver not loaded, init failed.
    The message says why and what to do."""


class AuthError(CotenantError):
    """A mutating API call is not authorised. The message never contains the token."""


class Unauthorized(AuthError):
    """No bearer token was given (HTTP 401)."""


class Forbidden(AuthError):
    """A bearer token was given but it is not the configured one (HTTP 403)."""


class ActionError(CotenantError):
    """An action cannot move to the requested state (e.g. approving an applied action)."""


class BackendError(CotenantError):
    """An actuator backend is unreachable, too slow, or refused the change; the message names
    the backend, the URL and what to check."""


class AlertPayloadError(CotenantError):
    """An Alertmanager webhook body is not a valid version-4 payload; the message names the
    field."""


class ReportError(CotenantError):
    """A weekly report cannot be produced (an invalid ISO week, an unwritable directory, or a
    PDF asked for where no Chromium is installed); the message says what to do."""
