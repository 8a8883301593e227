"""The dashboard without a browser: URL ranges, empty states, reports on disk, the mount."""

from __future__ import annotations

import gzip
import json
import re
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from cotenant.app.config import load_config
from cotenant.app.service import Service
from cotenant.core.errors import ConfigError, QueryError
from cotenant.dashboard import plotlyjs
from cotenant.dashboard.app import create_app
from cotenant.dashboard.data import DashboardData, step_for
from cotenant.dashboard.pages.reports import weeks
from cotenant.dashboard.timerange import parse_range
from cotenant.store.db import Store

NOW = 1_796_000_000_000_000_000
MIN = 60_000_000_000


def test_ranges_from_the_url() -> None:
    r = parse_range("15m", NOW)
    assert (r.since_ns, r.until_ns, r.live) == (NOW - 15 * MIN, NOW, True)
    assert parse_range(None, NOW, "1h").since_ns == NOW - 60 * MIN
    fixed = parse_range("2026-12-01T10:00:00Z..2026-12-01T11:00:00Z", NOW)
    assert not fixed.live and fixed.until_ns - fixed.since_ns == 60 * MIN
    assert parse_range("2026-11-01T10:00:00Z..now", NOW).live
    # long ranges are charted from the per-minute rollups, short ones from raw windows
    assert step_for(parse_range("24h", NOW)) % 60 == 0
    assert step_for(parse_range("1h", NOW)) == 60
    assert step_for(parse_range("5m", NOW)) == 1
    for bad, words in (
        ("yesterday", "not a duration"),
        ("0s", "longer than zero"),
        ("2026-12-01T11:00:00Z..2026-12-01T10:00:00Z", "after the start"),
        ("noon..now", "range start"),
    ):
        with pytest.raises(QueryError, match=words):
            parse_range(bad, NOW)


def test_a_bad_default_range_is_refused_naming_the_key() -> None:
    with Store(":memory:") as store, pytest.raises(ConfigError, match=r"dashboard\.default_range"):
        create_app(DashboardData(store), default_range="soon")


def _callback(client: Any, output: str, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    outs = [
        dict(zip(("id", "property"), o.rsplit(".", 1), strict=True)) for o in output.split("...")
    ]
    body = {
        "output": f"..{output}..",
        "outputs": outs,
        "inputs": inputs,
        "changedPropIds": [f"{inputs[0]['id']}.{inputs[0]['property']}"],
        "state": [{"id": "ov-drawn", "property": "data", "value": None}]
        if output.startswith("ov-p99")
        else [],
    }
    r = client.post("/_dash-update-component", json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.get_json()["response"]
    return out


def test_an_empty_store_says_what_is_missing(tmp_path: Path) -> None:
    with Store(":memory:") as store:
        app = create_app(
            DashboardData(store, otlp_hint="http://collector:4318/v1/traces"),
            report_dir=tmp_path / "reports",
        )
        c = app.server.test_client()
        params = [
            {"id": "ov-params", "property": "data", "value": {"range": "1h"}},
            {"id": "shell-tick", "property": "n_intervals", "value": None},
        ]
        tiles = _callback(
            c, "ov-models.children...ov-gpus.children...ov-range-label.children", params
        )
        text = str(tiles)
        assert "no spans received yet" in text and "http://collector:4318/v1/traces" in text
        assert "no GPU counters" in text
        chart = _callback(
            c, "ov-p99.figure...ov-p99.style...ov-p99-empty.children...ov-drawn.data", params
        )
        assert "point your OTLP exporter" in str(chart["ov-p99-empty"])
        assert chart["ov-p99"]["style"] == {"display": "none"}
        reports = _callback(
            c,
            "rep-list.children...rep-view.children",
            [{"id": "rep-params", "property": "data", "value": {"week": None}}],
        )
        assert "no weekly reports" in str(reports["rep-view"])
        missing = _callback(
            c,
            "inc-summary.children...inc-latency-box.children...inc-tokens-box.children"
            "...inc-phases-box.children"
            "...inc-causes-box.children...inc-evidence-box.children...inc-actions.children"
            "...inc-drill.children",
            [{"id": "inc-params", "property": "data", "value": {"id": "inc-nope"}}],
        )
        assert "no incident 'inc-nope'" in str(missing["inc-summary"])
        bad = _callback(
            c,
            "ov-models.children...ov-gpus.children...ov-range-label.children",
            [
                {"id": "ov-params", "property": "data", "value": {"range": "soon"}},
                {"id": "shell-tick", "property": "n_intervals", "value": None},
            ],
        )
        assert "not a duration" in str(bad["ov-models"])


def test_a_page_loads_only_the_scripts_it_uses(tmp_path: Path) -> None:
    with Store(":memory:") as store:
        index = create_app(DashboardData(store)).server.test_client().get("/").text
        for unused in ("async-mathjax", "async-markdown", "async-table", "package_data/plotly"):
            assert unused not in index  # Dash loads these only when a page renders them
        bundle = plotlyjs.choose()
        url = f"/_cotenant/{bundle.name}"
        assert json.dumps(url) in index  # the page's plotly loader
        c = create_app(DashboardData(store)).server.test_client()
        gz = c.get(url, headers={"Accept-Encoding": "gzip, deflate"})
        assert gz.status_code == 200 and gz.headers["Content-Encoding"] == "gzip"
        assert "max-age=31536000" in gz.headers["Cache-Control"]
        assert gzip.decompress(gz.data) == plotlyjs.COMPILE_HINT + bundle.path.read_bytes()
        assert len(gz.data) < len(bundle.body) / 2
        plain = c.get(url)
        assert "Content-Encoding" not in plain.headers and plain.data == bundle.body
        # the first version's way, kept for bench/dashboard.py: every script with the page
        eager = create_app(DashboardData(store), eager_loading=True).server.test_client()
        index = eager.get("/").text
        assert "async-mathjax" in index and "package_data/plotly" in index
        assert "_cotenant/" not in index


def test_the_plotly_bundle_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    full = plotlyjs.full_bundle()
    version = plotlyjs.version_of(full)
    assert version is not None and re.fullmatch(r"\d+\.\d+\.\d+", version)
    vendored = tmp_path / "plotly-cartesian.min.js"
    monkeypatch.setattr(plotlyjs, "VENDORED", vendored)
    assert plotlyjs.choose().path == full  # nothing vendored
    vendored.write_text("/**\n* plotly.js (cartesian - minified) v0.0.1\n*/\nwindow.Plotly={};")
    assert plotlyjs.choose().path == full  # another plotly.js than plotly.py's: not used
    vendored.write_text(f"/**\n* plotly.js (cartesian - minified) v{version}\n*/\nvar P;")
    chosen = plotlyjs.choose()
    assert chosen.path == vendored and chosen.name.startswith("plotly-cartesian.")
    assert plotlyjs.choose(full).path == full  # named explicitly
    with pytest.raises(ConfigError, match=r"plotly_js .*nope\.js: cannot read"):
        plotlyjs.choose(tmp_path / "nope.js")
    (tmp_path / "x.js").write_text("console.log('hi')")
    with pytest.raises(ConfigError, match=r"x\.js: not a plotly\.js bundle"):
        plotlyjs.choose(tmp_path / "x.js")
    with Store(":memory:") as store, pytest.raises(ConfigError, match="nope"):
        create_app(DashboardData(store), plotly_js=tmp_path / "nope.js")


def test_report_weeks_newest_first(tmp_path: Path) -> None:
    for week in ("2026-W48", "2026-W50", "2026-W49", "not-a-week", "2026-W51"):
        (tmp_path / week).mkdir()
        if week != "2026-W51":  # no report.html: not listed
            (tmp_path / week / "report.html").write_text("<p>r</p>")
    assert weeks(tmp_path) == ["2026-W50", "2026-W49", "2026-W48"]
    assert weeks(tmp_path / "absent") == []


def test_dashboard_off_leaves_only_the_api(tmp_path: Path) -> None:
    env = {
        "COTENANT_STORE_PATH": str(tmp_path / "s.duckdb"),
        "COTENANT_SERVER_PORT": "0",
        "COTENANT_OTLP_HTTP_ENABLED": "false",
        "COTENANT_OTLP_GRPC_ENABLED": "false",
        "COTENANT_NVML_ENABLED": "false",
        "COTENANT_ANALYSIS_ENABLED": "false",
        "COTENANT_DASHBOARD_ENABLED": "false",
    }
    svc = Service(load_config(None, env=env))
    t = threading.Thread(target=svc.run, kwargs={"banner": None}, daemon=True)
    t.start()
    try:
        assert svc.started.wait(30) and svc.endpoints is not None
        with httpx.Client(base_url=svc.endpoints.api, timeout=10) as c:
            assert c.get("/").status_code == 404
            assert c.get("/_dash-layout").status_code == 404
            assert c.get("/healthz").status_code == 200
            assert c.get("/api/v1/incidents").status_code == 200
    finally:
        svc.stop()
        t.join(30)


def test_a_failing_read_leaves_the_page_as_it_was(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    app = create_app(DashboardData(store), report_dir=tmp_path)
    store.close()  # every read now fails
    body = {
        "output": "..ov-incidents.children...ov-incidents-mark.data..",
        "outputs": [
            {"id": "ov-incidents", "property": "children"},
            {"id": "ov-incidents-mark", "property": "data"},
        ],
        "inputs": [
            {"id": "ov-params", "property": "data", "value": {"range": "1h"}},
            {"id": "shell-tick", "property": "n_intervals", "value": None},
            {"id": "ov-severity", "property": "value", "value": "all"},
        ],
        "changedPropIds": ["ov-params.data"],
        "state": [{"id": "ov-incidents-mark", "property": "data", "value": None}],
    }
    r = app.server.test_client().post("/_dash-update-component", json=body)
    assert r.status_code in (200, 204), r.data  # not a server error
    assert not (r.get_json(silent=True) or {}).get("response"), r.data  # and no output changed
