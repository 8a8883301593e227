"""PDF printing by headless Chromium (``--headless --print-to-pdf``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from cotenant.core.errors import ReportError

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str | None:
    """The first Chromium-family executable on PATH, or None."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


class ChromiumPrinter:
    """Prints an HTML file to PDF. ``browser`` is the executable (None: look on PATH).

    :meth:`check` raises ReportError when no browser is installed, so a caller can refuse
    a PDF before writing anything."""

    def __init__(self, browser: str | None = None, *, timeout_s: float = 120.0) -> None:
        self._browser = browser
        self._timeout_s = timeout_s

    def check(self) -> str:
        path = self._browser if self._browser is not None else find_browser()
        if not path or not (os.path.isfile(path) and os.access(path, os.X_OK)):
            where = f"{path!r} is not an executable" if path else "none found on PATH"
            raise ReportError(
                f"PDF needs headless Chromium ({where}; looked for {', '.join(BROWSERS)}): "
                "install it (Debian: apt-get install chromium) or leave pdf out of --format"
            )
        return path

    def print_pdf(self, html_file: Path, pdf_file: Path) -> None:
        """Print ``html_file`` to ``pdf_file``. ReportError when Chromium fails."""
        browser = self.check()
        with tempfile.TemporaryDirectory(prefix="cotenant-pdf-") as profile:
            cmd = [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                f"--user-data-dir={profile}",
                "--no-pdf-header-footer",
                "--run-all-compositor-stages-before-draw",
                "--virtual-time-budget=10000",
                f"--print-to-pdf={pdf_file}",
                html_file.resolve().as_uri(),
            ]
            try:
                res = subprocess.run(
                    cmd, capture_output=True, timeout=self._timeout_s, check=False, text=True
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise ReportError(f"Chromium could not print {html_file}: {exc}") from exc
        ok = pdf_file.is_file() and pdf_file.read_bytes()[:5] == b"%PDF-"
        if res.returncode != 0 or not ok:
            tail = (res.stderr or "").strip().splitlines()[-3:]
            raise ReportError(
                f"Chromium ({browser}) did not print {html_file} to PDF "
                f"(exit {res.returncode}): {' | '.join(tail)}"
            )
