"""The HTML report opens in headless Chromium with no console errors; a screenshot is kept."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service as ChromeService
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from cotenant.core.slos import Slos
from cotenant.reports.compute import ReportBuilder
from cotenant.reports.writer import write_report
from tests.reports.conftest import SLO, WEEK, Fortnight

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


def test_html_report_opens_offline_without_console_errors(
    fortnight: Fortnight, tmp_path: Path
) -> None:
    driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    store = fortnight.open()
    try:
        summary = ReportBuilder(
            store, slos=Slos.of_maps(SLO), dashboard_url="http://dash:8050"
        ).build(WEEK)
    finally:
        store.close()
    html = write_report(summary, tmp_path, ("html",))["html"]
    opts = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,2400"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=ChromeService(driver_path), options=opts)
    try:
        driver.get(html.as_uri())
        WebDriverWait(driver, 30).until(
            lambda d: len(d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot .main-svg")) >= 2
        )
        heat = driver.find_element(By.ID, "matrix")
        assert "train-job" in heat.text and "memcopy" in heat.text  # culprit axis drawn
        h2 = [e.text for e in driver.find_elements(By.TAG_NAME, "h2")]
        assert h2 == [
            "Summary",
            "Who hurt whom",
            "Causes",
            "Model loads",
            "GPUs",
            "Actions",
            "Recommendations",
        ]
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == []
        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "report-2026-W48.png"
        assert driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
    finally:
        driver.quit()


@pytest.fixture(autouse=True)
def _needs_chromedriver() -> None:
    if not (shutil.which("chromedriver") or Path("/usr/bin/chromedriver").exists()):
        pytest.fail("chromedriver is not installed (scripts/install-system-deps.sh)")
