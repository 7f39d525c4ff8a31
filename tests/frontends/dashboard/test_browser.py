"""The dashboard in a real browser: Debian's headless chromium driven with selenium. The page lists the models,
its rate figure moves under load, its Unload and Load buttons change the model's state, and a screenshot is
saved (``NAIAD_DASHBOARD_SCREENSHOT=docs/dashboard.png`` writes the README's). Skipped, with the reason, where
selenium, chromium or chromedriver is not installed (``apt-get install chromium chromium-driver``)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.frontends.dashboard.test_routes import BODY, infer_many, write_repository
from tests.server import RunningServer

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def _browser() -> Any:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install selenium)")
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("chromium or chromedriver is not installed (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-extensions", "--no-first-run", "--window-size=1360,900", "--hide-scrollbars"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def _alert(driver: Any) -> Any:
    """The page's open confirm() dialog, or None."""
    from selenium.common.exceptions import NoAlertPresentException

    try:
        alert = driver.switch_to.alert
        alert.text  # noqa: B018 - raises when there is none
        return alert
    except NoAlertPresentException:
        return None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0  # "–": no figure yet


def test_dashboard_in_chromium(tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = _browser()
    repo = tmp_path / "repository"
    write_repository(repo)
    server = RunningServer([repo], "--model-control-mode=explicit", "--load-model=*", "--allow-grpc=false",
                           "--allow-metrics=false", "--strict-readiness=false")
    stop = threading.Event()

    def traffic() -> None:  # a few hundred requests a second: kind to a shared machine
        while not stop.is_set():
            infer_many(server.http_port, "echo", 20)
            time.sleep(0.02)

    load = threading.Thread(target=traffic)
    try:
        wait = WebDriverWait(driver, 20, poll_frequency=0.2)
        driver.get(f"http://{server.url}/dashboard")

        def cell(model: str, name: str) -> str:
            found = driver.find_elements(By.CSS_SELECTOR, f'#models tr[data-model="{model}"] td.{name}')
            return found[0].text if found else ""

        wait.until(lambda _: cell("echo", "state") == "READY")
        rows = driver.find_elements(By.CSS_SELECTOR, "#models tbody tr")
        assert [(r.get_attribute("data-key"), r.find_element(By.CSS_SELECTOR, "td.state").text) for r in rows] == [
            ("broken/1", "UNAVAILABLE"), ("echo/1", "READY"), ("onnx_identity/1", "READY"),
            ("onnx_identity/2", "READY"), ("raises/1", "READY")]
        reason = driver.find_element(By.CSS_SELECTOR, '#models tr[data-model="broken"] .reason').text
        assert "model.py" in reason
        worker = driver.find_element(By.CSS_SELECTOR, '#instances tr[data-model="echo"] td.pid').text
        assert worker.isdigit() and int(worker) != server.proc.pid

        assert _number(cell("echo", "rate")) == 0
        load.start()
        infer_many(server.http_port, "raises", 2)
        wrong = BODY.replace('"INPUT0"', '"INPUT_0"')  # refused by the model's signature: failures too
        assert [server.request("POST", "/v2/models/onnx_identity/infer", wrong)[0] for _ in range(3)] == [400] * 3
        wait.until(lambda _: _number(cell("echo", "rate")) > 0)
        wait.until(lambda _: cell("raises", "errors").startswith("2"))
        errors = driver.find_element(By.CSS_SELECTOR, '#models tr[data-key="onnx_identity/2"] td.errors')
        wait.until(lambda _: errors.text.startswith("3"))  # (the latest version took them)
        assert "refused: 3" in errors.get_attribute("title") and "INPUT_0" in errors.get_attribute("title")

        # Unload while the model serves: the page asks first, and a "no" leaves it loaded.
        driver.find_element(By.CSS_SELECTOR, '#models tr[data-model="echo"] button.unload').click()
        alert = wait.until(lambda d: _alert(d))
        assert "echo is under load" in alert.text
        alert.dismiss()
        time.sleep(1.5)
        assert cell("echo", "state") == "READY" and server.request("GET", "/v2/models/echo/ready")[0] == 200
        # A few seconds of chart for the picture (longer when writing the README's).
        shot = os.environ.get("NAIAD_DASHBOARD_SCREENSHOT")
        time.sleep(45 if shot else 2)
        assert _number(cell("echo", "p99")) > 0
        png = tmp_path / "dashboard.png"
        assert driver.save_screenshot(str(png))
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        if shot:
            shutil.copyfile(png, shot)
        stop.set()
        load.join()

        wait.until(lambda _: _number(cell("echo", "rate")) == 0)  # idle now: Unload acts at once
        driver.find_element(By.CSS_SELECTOR, '#models tr[data-model="echo"] button.unload').click()
        assert _alert(driver) is None
        wait.until(lambda _: cell("echo", "state") == "UNAVAILABLE")
        status, _, body = server.request("POST", "/v2/repository/index")
        assert {"name": "echo", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"} in json.loads(body)
        wait.until(lambda _: not driver.find_elements(By.CSS_SELECTOR, '#instances tr[data-model="echo"]'))
        driver.find_element(By.CSS_SELECTOR, '#models tr[data-model="echo"] button.load').click()
        wait.until(lambda _: cell("echo", "state") == "READY")
        assert server.request("GET", "/v2/models/echo/ready")[0] == 200
    finally:
        stop.set()
        if load.is_alive():
            load.join()
        driver.quit()
        server.stop()
