"""End to end: `streamlit run app.py` in a real headless Chromium (Debian's chromium and
chromium-driver, driven by Selenium). Sets a model and a GPU count the way a person does, checks
the recommended layout's text against the CLI and that the charts drew, and saves a screenshot.

.ci/run installs Chromium, starts the app on a free localhost port (PLANNER_APP_URL) and sets
PLANNER_E2E_REQUIRED=1, so there a missing browser fails instead of skipping. Without
PLANNER_APP_URL the test starts and stops the app itself."""

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from planner import cli
from planner.search import short

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
REQUIRED = os.environ.get("PLANNER_E2E_REQUIRED") == "1"

pytestmark = pytest.mark.slow


def _need(what: str):
    if REQUIRED:
        pytest.fail(f"{what} (PLANNER_E2E_REQUIRED=1: .ci/run installs it)")
    pytest.skip(what)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"the app did not answer at {url} within {timeout_s:.0f} s")


@pytest.fixture(scope="module")
def app_url():
    url = os.environ.get("PLANNER_APP_URL")
    if url:
        _wait_http(url, 60)
        yield url
        return
    pytest.importorskip("streamlit")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.headless", "true",
                             "--server.port", str(port), "--server.address", "127.0.0.1",
                             "--browser.gatherUsageStats", "false"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_http(url, 60)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    if not (CHROMIUM and CHROMEDRIVER):
        _need("Debian's chromium and chromium-driver are not installed")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    # the flags a closed-network root sandbox needs (no sandbox, no background connections)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1600,2600"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _wait_for(driver, condition, timeout_s: float = 60, what: str = ""):
    from selenium.webdriver.support.ui import WebDriverWait

    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    return WebDriverWait(driver, timeout_s, poll_frequency=0.25,
                         ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)).until(
        condition, message=what)


def _set_number(driver, label: str, value: int) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = _wait_for(driver, lambda d: d.find_element(By.CSS_SELECTOR, f'input[aria-label="{label}"]'),
                    what=f"the {label!r} box")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(str(value), Keys.ENTER)


def _choose(driver, label: str, option: str) -> None:
    """A Streamlit selectbox: click it, type the option, press Enter."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = _wait_for(driver, lambda d: d.find_element(By.CSS_SELECTOR, f'input[aria-label="{label}"]'),
                    what=f"the {label!r} box")
    box.click()
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(option)
    time.sleep(0.3)  # the option list filters as one types
    box.send_keys(Keys.ENTER)


def _radio(driver, option: str):
    """A radio option by its text (textContent: .text is empty for what is scrolled out of view)."""
    from selenium.webdriver.common.by import By

    return _wait_for(driver, lambda d: next((r for r in d.find_elements(By.CSS_SELECTOR, '[data-testid="stRadioOption"]')
                                             if r.get_attribute("textContent").strip() == option), False),
                     what=f"the radio option {option!r}")


def test_dashboard_in_a_real_browser(app_url, browser, tmp_path):
    from selenium.webdriver.common.by import By

    out = io.StringIO()
    assert cli.main(["recommend", "--model", "llama-3-8b", "--gpus", "32", "--top", "10", "--json"], out=out) == 0
    expected = short(json.loads(out.getvalue())["layouts"][0]["layout"])

    browser.get(app_url)
    _wait_for(browser, lambda d: "Chosen layout:" in d.find_element(By.TAG_NAME, "body").text, what="first answer")
    _choose(browser, "Catalog model", "llama-3-8b")
    _wait_for(browser, lambda d: "model llama-3-8b" in d.find_element(By.TAG_NAME, "body").text, what="model change")
    _set_number(browser, "GPUs", 32)
    _wait_for(browser, lambda d: f"Chosen layout: {expected}" in d.find_element(By.TAG_NAME, "body").text,
              what=f"the CLI's first layout {expected!r}")
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "cluster 32 x h100-sxm" in body and "Traceback" not in body

    # three Vega charts (memory per stage, step time, speed against memory), each drawn with a size
    def drawn(d):
        charts = d.find_elements(By.CSS_SELECTOR, '[data-testid="stVegaLiteChart"] canvas, '
                                                  '[data-testid="stVegaLiteChart"] svg.marks')
        return charts if len(charts) >= 3 and all(c.size["width"] > 50 and c.size["height"] > 50 for c in charts) else False

    charts = _wait_for(browser, drawn, what="three drawn charts")
    assert len(charts) >= 3
    time.sleep(1.0)  # let the charts finish their first paint before the picture
    target = Path(os.environ.get("PLANNER_SCREENSHOT_DIR", tmp_path)) / "dashboard.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(target))
    assert target.stat().st_size > 20_000  # a rendered page, not a blank one

    # a click on the table's second row makes it the chosen layout
    second = short(json.loads(out.getvalue())["layouts"][1]["layout"])
    grid = browser.find_element(By.CSS_SELECTOR, '[data-testid="stDataFrame"]')
    from selenium.webdriver.common.action_chains import ActionChains

    top_left = (-grid.size["width"] // 2, -grid.size["height"] // 2)  # offsets are from the element's centre
    row_px = 35  # glide-data-grid's default header and row height in Streamlit
    ActionChains(browser).move_to_element_with_offset(grid, top_left[0] + 20, top_left[1] + row_px + row_px + row_px // 2) \
        .click().perform()
    _wait_for(browser, lambda d: f"Chosen layout: {second}" in d.find_element(By.TAG_NAME, "body").text,
              what=f"row 2 ({second!r}) chosen by a click")


def test_an_uploaded_config_with_nonsense_values_is_a_message(app_url, browser, tmp_path):
    from selenium.webdriver.common.by import By

    browser.get(app_url)
    _wait_for(browser, lambda d: "Chosen layout:" in d.find_element(By.TAG_NAME, "body").text, what="first answer")
    _radio(browser, "config.json").click()
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"model_type": "llama", "hidden_size": -4096, "num_hidden_layers": 32,
                               "num_attention_heads": 32, "vocab_size": 32000, "intermediate_size": 11008}))
    upload = _wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, 'input[type="file"]'), what="the uploader")
    upload.send_keys(str(bad))
    alert = _wait_for(browser, lambda d: next((e for e in d.find_elements(By.CSS_SELECTOR, '[data-testid="stAlert"]')
                                               if "hidden" in e.text), False), what="the error line")
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "Traceback" not in body and len(alert.text.strip().splitlines()) == 1
    # the page still works: back to the catalog, the answer returns
    _radio(browser, "catalog").click()
    _wait_for(browser, lambda d: "Chosen layout:" in d.find_element(By.TAG_NAME, "body").text, what="answer again")
