"""The dashboard in a real browser (Debian's chromium, headless, through chromedriver) against
the real service — Service in a thread, its clock standing inside a simulated fault, the real
action controller in manual mode applying through the webhook backend to a local receiver.

Every page must load without browser console errors (SEVERE); screenshots of each page go
to ``tests/artifacts/``."""

from __future__ import annotations

import dataclasses
import http.server
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from conftest import ROOT
from dashboard_scenario import CULPRIT, VICTIM, Filled, fill
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service as ChromeService
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from cotenant.app.config import load_config
from cotenant.app.service import Service

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS = ROOT / "tests" / "artifacts"
TOKEN = "dashboard-test-token"
WEEK = "2026-W49"

pytestmark = pytest.mark.skipif(
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
    reason="needs Debian's chromium and chromium-driver (make test installs them)",
)


class _Receiver(http.server.BaseHTTPRequestHandler):
    """The webhook the manual-mode actions are applied through: records each POST."""

    received: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).received.append(json.loads(body))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *_: Any) -> None:
        pass


@dataclasses.dataclass
class Running:
    url: str
    filled: Filled
    service: Service
    webhook_posts: list[dict[str, Any]]


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tmp = tmp_path_factory.mktemp("dashboard")
    filled = fill(tmp / "store.duckdb")
    reports = tmp / "reports"
    (reports / WEEK).mkdir(parents=True)
    (reports / WEEK / "report.html").write_text(
        "<html><body><h1>Weekly contention report 2026-W49</h1>"
        "<p>chat lost 12 minutes to train-job</p></body></html>"
    )
    # the bundled policy only notifies about a process that serves no requests; this one
    # raises the victim's priority instead, so there is a change to approve
    bundled = (ROOT / "cotenant" / "rules" / "policy.yaml").read_text()
    policy = tmp / "policy.yaml"
    policy.write_text(
        bundled.replace(
            "cotenant: {action: rate_limit, target: culprit}",
            "cotenant: {action: priority, target: victim, priority: 0}",
        )
    )
    assert policy.read_text() != bundled
    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    _Receiver.received = []
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    env = {
        "COTENANT_STORE_PATH": str(filled.path),
        "COTENANT_SERVER_PORT": "0",
        "COTENANT_OTLP_HTTP_PORT": "0",
        "COTENANT_OTLP_GRPC_ENABLED": "false",
        "COTENANT_NVML_ENABLED": "false",
        "COTENANT_ANALYSIS_INTERVAL_S": "0.5",
        "COTENANT_ANALYSIS_SLO_MS": ",".join(f"{k}={v}" for k, v in filled.slo_ms.items()),
        "COTENANT_ACTUATORS_MODE": "manual",
        "COTENANT_ACTUATORS_TOKEN": TOKEN,
        "COTENANT_ACTUATORS_BACKEND": "webhook",
        "COTENANT_ACTUATORS_POLICY": str(policy),
        "COTENANT_ACTUATORS_BACKEND_URL": f"http://127.0.0.1:{hook.server_address[1]}/hook",
        "COTENANT_ACTUATORS_WEBHOOK_SECRET": "test-secret",
        "COTENANT_ACTUATORS_INTERVAL_S": "0.5",
        "COTENANT_DASHBOARD_REFRESH_S": "2",
        "COTENANT_REPORT_DIR": str(reports),
    }
    svc = Service(load_config(None, env=env), clock_ns=lambda: filled.now_ns)
    t = threading.Thread(target=svc.run, kwargs={"banner": None}, daemon=True)
    t.start()
    assert svc.started.wait(60), "service did not start"
    assert svc.endpoints is not None
    try:
        yield Running(svc.endpoints.api, filled, svc, _Receiver.received)
    finally:
        svc.stop()
        t.join(60)
        hook.shutdown()
        hook.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(arg)
    opts.add_argument("--window-size=1400,1000")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=ChromeService(str(CHROMEDRIVER)), options=opts)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(
    driver: WebDriver, cond: Callable[[WebDriver], Any], what: str, timeout: float = 20
) -> Any:
    try:
        # live pages re-render on their refresh tick: an element found may go stale
        wait = WebDriverWait(
            driver,
            timeout,
            poll_frequency=0.1,
            ignored_exceptions=(StaleElementReferenceException,),
        )
        return wait.until(cond)
    except TimeoutException:
        shot = ARTIFACTS / f"timeout-{re.sub(r'[^a-z0-9]+', '-', what.lower())}.png"
        driver.save_screenshot(str(shot))
        raise AssertionError(
            f"timed out waiting for {what}; page: "
            + driver.find_element(By.TAG_NAME, "main").text[:2000]
        ) from None


def _text(driver: WebDriver, css: str) -> str:
    els = driver.find_elements(By.CSS_SELECTOR, css)
    return " ".join(e.text for e in els)


def _settled(driver: WebDriver) -> None:
    """Dash has no callback in flight (the renderer marks the document while loading)."""
    _wait(
        driver,
        lambda d: not d.find_elements(By.CSS_SELECTOR, "[data-dash-is-loading='true']"),
        "callbacks to finish",
    )


def _open(driver: WebDriver, url: str, ready_css: str, contains: str = "") -> None:
    driver.get_log("browser")  # drop what earlier pages logged
    driver.get(url)
    _wait(
        driver,
        lambda d: (
            contains in _text(d, ready_css)
            if contains
            else d.find_elements(By.CSS_SELECTOR, ready_css)
        ),
        f"{ready_css} {contains}",
    )
    _settled(driver)


_ROWS_JS = (
    "return Array.from(document.querySelectorAll(arguments[0] + ' tbody tr'))"
    ".map(r => Array.from(r.cells).map(c => c.innerText));"
)


def _rows(driver: WebDriver, table: str) -> list[list[str]]:
    """A table's cells as text, read in one go (no element can go stale in between)."""
    rows: list[list[str]] = driver.execute_script(_ROWS_JS, table)
    return rows


def _no_console_errors(driver: WebDriver, page: str) -> None:
    driver.save_screenshot(str(ARTIFACTS / f"dashboard-{page}.png"))
    severe = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, f"{page}: browser console errors: {severe}"


_PLOTLY_JS = (
    "return performance.getEntriesByType('resource').map(r => r.name)"
    ".filter(n => n.includes('plotly') && n.endsWith('.js'));"
)


def _plotly_fetched(driver: WebDriver) -> list[str]:
    """The plotly.js scripts this page load has fetched so far."""
    names: list[str] = driver.execute_script(_PLOTLY_JS)
    return names


def test_overview_lists_the_victims_incident(running: Running, browser: WebDriver) -> None:
    _open(browser, running.url + "/", "#ov-incident-table", VICTIM)
    _wait(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, "#ov-p99 .js-plotly-plot"),
        "the p99 chart",
    )
    rows = _rows(browser, "#ov-incident-table")
    assert VICTIM in [r[4] for r in rows], rows
    chat = next(r for r in rows if r[4] == VICTIM)
    assert chat[1] == "open" and chat[2] == "breach" and chat[3] == "e2e", chat
    assert chat[9] == "cotenant" and chat[10] == CULPRIT, chat
    tiles = _text(browser, "#ov-models")
    assert "chat" in tiles and "embed" in tiles and "SLO" in tiles
    assert "gpu0" in _text(browser, "#ov-gpus")
    # plotly.js came once, from the dashboard's own hashed URL, not also from Dash's loader
    fetched = _plotly_fetched(browser)
    assert len(fetched) == 1 and "/_cotenant/plotly" in fetched[0], fetched
    _no_console_errors(browser, "overview")


def test_overview_filters_incidents_by_severity(running: Running, browser: WebDriver) -> None:
    _open(browser, running.url + "/", "#ov-incident-table", VICTIM)
    every = _rows(browser, "#ov-incident-table")
    breach = next(r[0] for r in every if r[4] == VICTIM and r[2] == "breach")

    def choose(value: str) -> None:
        radio = browser.find_element(By.CSS_SELECTOR, f"#ov-severity input[value='{value}']")
        radio.find_element(By.XPATH, "ancestor::label").click()

    def listed(d: WebDriver) -> list[list[str]]:
        return _rows(d, "#ov-incident-table") if d.find_elements(By.ID, "ov-incident-table") else []

    # the neighbour slowed within its SLO is a degradation; the victim's SLO breach is not
    choose("degradation")
    _wait(
        browser,
        lambda d: listed(d) and breach not in [r[0] for r in listed(d)],
        "degradations only",
    )
    assert {r[2] for r in listed(browser)} == {"degradation"}
    assert "embed" in [r[4] for r in listed(browser)]
    choose("breach")
    _wait(browser, lambda d: breach in [r[0] for r in listed(d)], "breaches only")
    assert {r[2] for r in listed(browser)} == {"breach"}


def test_incident_shows_the_culprit_first_in_the_causes_chart(
    running: Running, browser: WebDriver
) -> None:
    _open(browser, running.url + "/", "#ov-incident-table", VICTIM)
    iid = next(r[0] for r in _rows(browser, "#ov-incident-table") if r[4] == VICTIM)
    _wait(browser, lambda d: d.find_element(By.LINK_TEXT, iid).click() or True, "the link")
    _wait(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, "#inc-causes .js-plotly-plot"),
        "the causes chart",
    )
    assert f"/incident?id={iid}" in browser.current_url
    causes = browser.execute_script(
        "const g = document.querySelector('#inc-causes .js-plotly-plot');"
        "return {y: g.data[0].y, culprit: g.data[0].customdata};"
    )
    assert causes["culprit"][0] == CULPRIT, causes
    assert causes["y"][0].startswith("1. cotenant"), causes
    _wait(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, "#inc-evidence .js-plotly-plot"),
        "the evidence chart",
    )
    evidence = browser.execute_script(
        "return document.querySelector('#inc-evidence .js-plotly-plot').data.map(t => t.name);"
    )
    assert f"{CULPRIT} SM utilisation" in evidence
    assert browser.find_elements(By.CSS_SELECTOR, "#inc-latency .js-plotly-plot")
    assert browser.find_elements(By.CSS_SELECTOR, "#inc-phases .js-plotly-plot")
    _settled(browser)
    _no_console_errors(browser, "incident")
    # the link can be pasted: the same view opens from the URL alone, range included
    url = browser.current_url
    _open(browser, url, "#inc-top", CULPRIT)


def test_range_picker_and_url_agree(running: Running, browser: WebDriver) -> None:
    # picking a range writes it into the URL (a link to paste) and re-reads the page
    _open(browser, running.url + "/", "#ov-range-label", "live")
    label = _text(browser, "#ov-range-label")
    browser.find_element(By.ID, "shell-range").click()
    _wait(
        browser,
        lambda d: d.find_elements(By.XPATH, "//*[text()='last 15m']")[-1].click() or 1,
        "option",
    )
    _wait(browser, lambda d: d.current_url.endswith("/?range=15m"), "the URL to carry the range")
    _wait(browser, lambda d: _text(d, "#ov-range-label") not in ("", label), "the page to re-read")
    # and a pasted URL sets the picker
    _open(browser, running.url + "/gpus?range=15m", "#gpu-who", CULPRIT)
    picked = browser.execute_script("return document.querySelector('#shell-range').innerText")
    assert "15m" in picked
    nav = browser.find_element(By.ID, "shell-nav-overview").get_attribute("href") or ""
    assert nav.endswith("/?range=15m")
    _open(browser, running.url + "/?range=yesterday", ".error-state", "not a duration")
    _no_console_errors(browser, "bad-range")


def test_gpus_page_shows_the_non_model_process(running: Running, browser: WebDriver) -> None:
    _open(browser, running.url + "/gpus", "#gpu-who", CULPRIT)
    row = next(r for r in _rows(browser, "#gpu-who") if r[1] == CULPRIT)
    assert row[3] == "non-model process", row
    _wait(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, "#gpu-heatmap-graph .js-plotly-plot"),
        "the heatmaps",
    )
    names = browser.execute_script(
        "return Array.from(document.querySelectorAll('#gpu-sharing .js-plotly-plot'))"
        ".flatMap(g => g.data.map(t => t.name));"
    )
    assert f"{CULPRIT} (non-model)" in names and VICTIM in names
    _no_console_errors(browser, "gpus")


def _proposed(running: Running, deadline_s: float = 30) -> dict[str, Any]:
    control = running.service.central.actions
    assert control is not None
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        acts = [
            a for a in control.list_actions() if a["state"] == "proposed" and a["kind"] != "notify"
        ]
        if acts:
            return acts[0]
        time.sleep(0.1)
    raise AssertionError(f"no action proposed: {control.list_actions()}")


def test_approving_a_proposed_action_applies_it(running: Running, browser: WebDriver) -> None:
    action = _proposed(running)
    aid = action["id"]
    _open(browser, running.url + "/actions", "#act-log", aid)
    assert "mode: manual" in _text(browser, "#act-mode")
    button = f"//button[contains(@id, '{aid}') and text()='approve']"
    # a wrong token is refused and changes nothing
    browser.find_element(By.ID, "act-token").send_keys("not-the-token")
    browser.find_element(By.XPATH, button).click()
    _wait(browser, lambda d: "not the configured one" in _text(d, "#act-message"), "the refusal")
    assert running.service.central.actions is not None
    assert (
        next(a for a in running.service.central.actions.list_actions() if a["id"] == aid)["state"]
        == "proposed"
    )
    assert browser.find_element(By.ID, "act-token").get_attribute("value") == ""
    browser.find_element(By.ID, "act-token").send_keys(TOKEN)
    browser.find_element(By.XPATH, button).click()
    _wait(browser, lambda d: "is now applied" in _text(d, "#act-message"), "the approval")
    _wait(
        browser,
        lambda d: any(r[0] == aid and r[6] == "applied" for r in _rows(d, "#act-log")),
        "the new state in the log",
    )
    after = next(a for a in running.service.central.actions.list_actions() if a["id"] == aid)
    assert after["state"] == "applied"
    assert any(
        p.get("event") == "apply" and p.get("target") == action["target"]
        for p in running.webhook_posts
    )
    # the token is never in the page: not in the DOM, not in any Dash store
    assert TOKEN not in browser.page_source
    _no_console_errors(browser, "actions")


def test_reports_page_shows_the_weekly_report(running: Running, browser: WebDriver) -> None:
    _open(browser, running.url + "/reports", "#rep-weeks", WEEK)
    frame = browser.find_element(By.ID, "rep-frame")
    browser.switch_to.frame(frame)
    try:
        assert "Weekly contention report 2026-W49" in browser.find_element(By.TAG_NAME, "h1").text
    finally:
        browser.switch_to.default_content()
    _no_console_errors(browser, "reports")
    assert _plotly_fetched(browser) == []  # a page without charts does not load plotly.js
    # ... until a page with charts is opened from it: then plotly loads, once
    browser.find_element(By.ID, "shell-nav-gpus").click()
    _wait(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, "#gpu-heatmap-graph .js-plotly-plot"),
        "the GPU heatmaps after navigating from the reports page",
    )
    fetched = _plotly_fetched(browser)
    assert len(fetched) == 1 and "/_cotenant/plotly" in fetched[0], fetched
    _settled(browser)
    _no_console_errors(browser, "reports-to-gpus")
    _open(browser, running.url + "/reports?week=../../etc", ".error-state", "not a week")


def test_api_routes_still_answer_beside_the_dashboard(running: Running) -> None:
    with httpx.Client(base_url=running.url, timeout=10) as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 200
        assert "cotenant_" in c.get("/metrics").text
        assert c.get("/openapi.json").json()["info"]
        assert c.get("/docs").status_code == 200
        incidents = c.get("/api/v1/incidents", params={"model": VICTIM}).json()["incidents"]
        assert incidents and incidents[0]["model"] == VICTIM
        assert c.get("/api/v1/incidents/inc-nope").status_code == 404  # the API's 404, not Dash's
        page = c.get("/")
        assert page.status_code == 200 and "_dash-config" in page.text
        assert c.get("/_dash-layout").status_code == 200
