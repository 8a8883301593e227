"""How the command line configures logging: ``[log] level`` and ``[log] format``.

``text``: one line per record, ``time level logger: message``. ``json``: one JSON object per
line, for a log pipeline (Loki, Elasticsearch, Cloud Logging) to index without parsing:
``ts`` (RFC 3339, UTC, milliseconds), ``level``, ``logger``, ``message``, ``thread``, and
``exc_info`` (the formatted traceback) when the record has one. Library code never calls
this: only ``cotenant.cli.main`` and the gateway's command do, once, at start.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import TextIO

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record (module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "thread": record.threadName,
        }
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc_info"] = record.exc_text
        return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(level: str, fmt: str = "text", stream: TextIO | None = None) -> None:
    """Send every record at ``level`` or above to ``stream`` (stderr) as ``fmt`` (``text`` or
    ``json``), replacing the handler an earlier call added (others, a test harness's, stay)."""
    handler = _Ours(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Ours)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


class _Ours(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`configure_logging` adds (and replaces on the next call)."""
