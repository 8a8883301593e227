"""JSON answers of the HTTP APIs that always serialise.

Starlette's ``JSONResponse`` refuses NaN and infinities (``allow_nan=False``: JSON has no
such numbers) and fails on a lone surrogate (``\\ud800`` in a JSON body decodes to one, and
UTF-8 cannot encode it): either would turn a good answer into a 500. :class:`SafeJSONResponse`
answers the same bytes when neither occurs, and otherwise writes a non-finite float as
``null`` and escapes the surrogate (``"\\ud800"``, valid JSON text).
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.responses import JSONResponse


def finite(obj: Any) -> Any:
    """``obj`` (JSON-ready: dicts, lists, scalars) with every non-finite float as None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def dumps(content: Any) -> bytes:
    """``content`` as compact JSON bytes; see the module docstring for NaN and surrogates."""
    try:
        return json.dumps(
            content, ensure_ascii=False, allow_nan=False, separators=(",", ":")
        ).encode("utf-8")
    except ValueError:  # a non-finite float, or a lone surrogate (UnicodeEncodeError)
        return json.dumps(
            finite(content), ensure_ascii=True, allow_nan=False, separators=(",", ":")
        ).encode("ascii")


class SafeJSONResponse(JSONResponse):
    """``JSONResponse`` rendered by :func:`dumps`: never fails on NaN or a lone surrogate."""

    def render(self, content: Any) -> bytes:
        return dumps(content)
