"""plotly.js for the dashboard's charts: which bundle, served how, loaded when.

A first visit (empty browser cache) spends most of its time compiling and running JavaScript,
and plotly.js is the biggest piece of it (plotly.py's full bundle: 4.8 MB, about 1 s of
main-thread time on a 2-core machine). So:

* the bundle is plotly's cartesian partial bundle (every trace type the pages draw — scatter,
  bar, heatmap — in 1.5 MB) when one is vendored at ``dashboard/vendor/plotly-cartesian.min.js``
  with the plotly.js version plotly.py ships, otherwise plotly.py's full bundle; ``plotly_js``
  names another file;
* it is served at a URL carrying its content hash (cached for a year), gzip-compressed for
  browsers that accept it (compressed once, on first request), headed by V8's
  ``//# allFunctionsCalledOnLoad`` compile hint (Chrome 136+ compiles it all on a background
  thread while it downloads, instead of function by function on the main thread as it runs);
* it is loaded once, and only where a graph is drawn: ``dcc.Graph`` loads plotly with
  ``Promise.resolve(window.Plotly || <add Dash's plotly script>)``, so the page sets
  ``window.Plotly`` to a thenable that adds this bundle's script the first time it is awaited
  (the real plotly replaces it when it runs). Pages that always draw charts (``chart_paths``)
  start the fetch as soon as the HTML arrives, while Dash's own scripts load.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

import flask
from dash import Dash

from cotenant.core.errors import ConfigError

VENDORED = Path(__file__).with_name("vendor") / "plotly-cartesian.min.js"
COMPILE_HINT = b"//# allFunctionsCalledOnLoad\n"
_VERSION = re.compile(rb"plotly\.js[^\n]*?\bv(\d+\.\d+\.\d+)")


def full_bundle() -> Path:
    """plotly.py's own full bundle (what Dash serves by default)."""
    import plotly

    return Path(plotly.__file__).with_name("package_data") / "plotly.min.js"


def version_of(path: Path) -> str | None:
    """The plotly.js version in a bundle's licence header (None when it has none)."""
    with path.open("rb") as f:
        m = _VERSION.search(f.read(400))
    return m.group(1).decode() if m else None


@dataclass
class Bundle:
    """One plotly.js file as served (``body``: the compile hint, then the file), read once;
    ``gzipped`` is compressed on first use."""

    path: Path
    body: bytes
    _gz: bytes | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @functools.cached_property
    def name(self) -> str:
        """``<file stem>.<content hash>.js``: a new bundle gets a new URL."""
        digest = hashlib.sha256(self.body).hexdigest()[:16]
        return f"{self.path.name.removesuffix('.min.js').removesuffix('.js')}.{digest}.min.js"

    def gzipped(self) -> bytes:
        with self._lock:
            if self._gz is None:
                self._gz = gzip.compress(self.body, compresslevel=6, mtime=0)
            return self._gz


def choose(plotly_js: str | Path | None = None) -> Bundle:
    """The bundle to serve: ``plotly_js`` when given (ConfigError when it is not a readable
    plotly.js bundle), else the vendored partial bundle when its version is plotly.py's, else
    the full one."""
    if plotly_js is not None:
        path = Path(plotly_js)
        try:
            body = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"plotly_js {path}: cannot read it ({exc.strerror})") from exc
        if version_of(path) is None:
            raise ConfigError(f"plotly_js {path}: not a plotly.js bundle (no version header)")
        return Bundle(path, COMPILE_HINT + body)
    full = full_bundle()
    if VENDORED.is_file() and version_of(VENDORED) == version_of(full):
        full = VENDORED
    return Bundle(full, COMPILE_HINT + full.read_bytes())


_LOADER = """<script>
(function () {
  var url = %(url)s, loading = null;
  function load() {
    if (loading === null) {
      loading = new Promise(function (ok, fail) {
        var s = document.createElement("script");
        s.src = url;
        s.async = true;
        s.onload = function () { ok(); };
        s.onerror = function () { fail(new Error("plotly.js did not load from " + url)); };
        document.head.appendChild(s);
      });
    }
    return loading;
  }
  window.Plotly = {then: function (ok, fail) { return load().then(ok, fail); }};
  if (%(paths)s.indexOf(window.location.pathname) >= 0) { load().catch(function () {}); }
})();
</script>"""


def install(app: Dash, bundle: Bundle, chart_paths: tuple[str, ...]) -> str:
    """Serve ``bundle`` from ``app`` and load it as described above; returns its URL."""
    routes = app.config.routes_pathname_prefix
    requests = app.config.requests_pathname_prefix
    url = f"{requests}_cotenant/{bundle.name}"

    def serve() -> flask.Response:
        gz = "gzip" in flask.request.headers.get("Accept-Encoding", "")
        resp = flask.Response(bundle.gzipped() if gz else bundle.body, mimetype="text/javascript")
        if gz:
            resp.headers["Content-Encoding"] = "gzip"
        resp.headers["Vary"] = "Accept-Encoding"
        resp.headers["Cache-Control"] = "public, max-age=31536000, immutable"
        return resp

    app.server.add_url_rule(f"{routes}_cotenant/{bundle.name}", "cotenant_plotlyjs", serve)
    # compress in the background now, so the first visitor does not wait for it (~0.2 s)
    threading.Thread(target=bundle.gzipped, name="cotenant-plotly-gzip", daemon=True).start()
    paths = [requests.rstrip("/") + p if p != "/" else requests for p in chart_paths]
    loader = _LOADER % {"url": json.dumps(url), "paths": json.dumps(paths)}
    assert "{%css%}" in app.index_string
    app.index_string = app.index_string.replace("{%css%}", "{%css%}\n" + loader)
    return url
