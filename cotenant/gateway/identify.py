"""Which model and tenant a request is for, and writing the priority into it.

A *source* says where to read a name from (the ``--model-from`` / ``--tenant-from`` flags):

* ``body`` or ``body:FIELD`` — a top-level string field of the JSON body (``model`` by
  default: the OpenAI-style ``{"model": "llama-3-8b", ...}``);
* ``header:NAME`` — a request header;
* ``path`` or ``path:REGEX`` — the first group of a regular expression searched in the request
  path (default ``^/v2/models/([^/]+)``, Triton's KServe-v2 URLs);
* ``none`` — not identified.

A request where the source has nothing to say is counted under :data:`UNKNOWN`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote

from cotenant.core.errors import UsageError
from cotenant.gateway.http1 import Head

UNKNOWN = "unknown"
DEFAULT_PATH_RE = r"^/v2/models/([^/]+)"
MAX_NAME_CHARS = 256

SourceKind = Literal["body", "header", "path", "none"]
PriorityField = Literal["none", "vllm", "triton"]


class BadRequest(Exception):
    """The request cannot be identified (e.g. its JSON body is malformed): answer 400."""


@dataclass(frozen=True)
class Source:
    """Where a name is read from; build with :func:`parse_source`."""

    kind: SourceKind
    field: str = ""
    header: bytes = b""
    pattern: re.Pattern[bytes] | None = None


def parse_source(text: str, flag: str) -> Source:
    """Parse a source spec (see the module docstring); raises :class:`UsageError` naming
    ``flag`` and the value."""
    kind, _, arg = text.partition(":")
    if kind == "body":
        name = arg or "model"
        return Source("body", field=name)
    if kind == "header":
        if not arg or not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", arg):
            raise UsageError(f"{flag} {text!r}: give a header name, e.g. header:X-Model")
        return Source("header", header=arg.lower().encode())
    if kind == "path":
        try:
            pat = re.compile((arg or DEFAULT_PATH_RE).encode())
        except re.error as exc:
            raise UsageError(f"{flag} {text!r}: invalid regular expression: {exc}") from None
        if pat.groups < 1:
            raise UsageError(f"{flag} {text!r}: the regular expression needs one (group)")
        return Source("path", pattern=pat)
    if text == "none":
        return Source("none")
    raise UsageError(f"{flag} {text!r}: use body[:FIELD], header:NAME, path[:REGEX] or none")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_body(body: bytes) -> Any:
    """The JSON document in ``body``; raises :class:`BadRequest` naming the problem (also for
    ``NaN``/``Infinity``, which are not JSON)."""
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise BadRequest("request body is not UTF-8 JSON") from None
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None


class Identifier:
    """Reads the model and tenant of a request; see :func:`parse_source`."""

    def __init__(self, model: Source, tenant: Source) -> None:
        self.model = model
        self.tenant = tenant
        self.needs_json = model.kind == "body" or tenant.kind == "body"

    def identify(self, head: Head, body: bytes) -> tuple[str, str, Any]:
        """``(model, tenant, parsed JSON body or None)``; raises :class:`BadRequest`."""
        doc: Any = None
        if self.needs_json and body:
            doc = parse_json_body(body)
        return (
            self._read(self.model, head, doc, "model"),
            self._read(self.tenant, head, doc, "tenant"),
            doc,
        )

    @staticmethod
    def _read(src: Source, head: Head, doc: Any, what: str) -> str:
        value: str | None = None
        if src.kind == "body":
            if isinstance(doc, dict):
                v = doc.get(src.field)
                if v is not None and not isinstance(v, str):
                    raise BadRequest(
                        f"field {src.field!r} ({what}) must be a string, not {type(v).__name__}"
                    )
                value = v
        elif src.kind == "header":
            raw = head.get(src.header)
            if raw is not None:
                value = raw.decode("latin-1")
        elif src.kind == "path":
            assert src.pattern is not None
            path = head.start[1].split(b"?", 1)[0]
            match = src.pattern.search(path)
            if match is not None and match.group(1):
                value = unquote(match.group(1).decode("latin-1"))
        if not value:
            return UNKNOWN
        if len(value) > MAX_NAME_CHARS:
            raise BadRequest(f"{what} name longer than {MAX_NAME_CHARS} characters")
        return value


def inject_priority(doc: Any, where: PriorityField, priority: int) -> bytes | None:
    """The JSON body with ``priority`` written where the server reads it, or None when
    ``doc`` is not a JSON object: vLLM's top-level ``priority``, Triton's
    ``parameters.priority``."""
    if not isinstance(doc, dict) or where == "none":
        return None
    if where == "vllm":
        doc["priority"] = priority
    else:
        params = doc.get("parameters")
        if not isinstance(params, dict):
            params = doc["parameters"] = {}
        params["priority"] = priority
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
