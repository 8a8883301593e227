"""Writes a week's report to disk: ``{dir}/{YYYY-Www}/report.html|report.md|report.pdf`` and
``summary.json`` (the numbers), the layout the dashboard's Reports page lists."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cotenant.core.errors import ReportError
from cotenant.reports.html import render_html
from cotenant.reports.markdown import render_markdown
from cotenant.reports.pdf import ChromiumPrinter
from cotenant.reports.summary import WeekSummary

FORMATS = ("html", "md", "pdf")


def parse_formats(text: str, name: str = "--format") -> tuple[str, ...]:
    """``"html,md"`` -> ("html", "md"); ReportError naming an unknown or missing format."""
    got = [f.strip().lower() for f in text.split(",") if f.strip()]
    bad = [f for f in got if f not in FORMATS]
    if bad or not got:
        raise ReportError(
            f"{name} {text!r}: {'unknown format ' + ', '.join(bad) if bad else 'no format'}; "
            f"choose from {', '.join(FORMATS)}"
        )
    return tuple(dict.fromkeys(got))


def write_report(
    summary: WeekSummary,
    out_dir: str | Path,
    formats: tuple[str, ...],
    *,
    printer: ChromiumPrinter | None = None,
) -> dict[str, Path]:
    """Write ``summary`` in ``formats`` (plus summary.json) and return the paths written.

    Raises ReportError before writing anything when a PDF is asked for and no Chromium is
    installed, and when the directory cannot be written."""
    printer = printer or ChromiumPrinter()
    if "pdf" in formats:
        printer.check()
    week_dir = Path(out_dir) / summary.week
    try:
        week_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportError(f"cannot create report directory {week_dir}: {exc}") from exc
    written: dict[str, Path] = {}
    html_path = week_dir / "report.html"
    try:
        _atomic(week_dir / "summary.json", json.dumps(summary.to_dict(), indent=2) + "\n")
        written["json"] = week_dir / "summary.json"
        if "html" in formats or "pdf" in formats:
            _atomic(html_path, render_html(summary))
            if "html" in formats:
                written["html"] = html_path
        if "md" in formats:
            _atomic(week_dir / "report.md", render_markdown(summary))
            written["md"] = week_dir / "report.md"
    except OSError as exc:
        raise ReportError(f"cannot write the report into {week_dir}: {exc}") from exc
    if "pdf" in formats:
        try:
            printer.print_pdf(html_path, week_dir / "report.pdf")
        finally:
            if "html" not in formats:
                html_path.unlink(missing_ok=True)
        written["pdf"] = week_dir / "report.pdf"
    return written


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
