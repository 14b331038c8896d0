"""End to end: `streamlit run app.py` in a real headless Chromium (Debian's chromium and
chromium-driver, driven by Selenium) on a 1280x800 screen. Sets a model and a GPU count the way a
person does, checks the headline (layout, verdict, tokens/s, the best other engine) against the
CLI, that the charts drew with their legends inside them, and saves a screenshot of the top of the
page (docs/dashboard.png is a copy of it).

.ci/run installs Chromium, starts the app on a free localhost port (PLANNER_APP_URL) and sets
PLANNER_E2E_REQUIRED=1, so there a missing browser fails instead of skipping. Without
PLANNER_APP_URL the test starts and stops the app itself."""

import io
import itertools
import json
import os
import re
import struct
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from planner import cli, report
from planner.results import short

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
REQUIRED = os.environ.get("PLANNER_E2E_REQUIRED") == "1"
SCREEN = (1280, 800)  # a laptop's page: the headline, legends and screenshot are checked at this size

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
                 "--disable-dev-shm-usage", f"--window-size={SCREEN[0]},{SCREEN[1]}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    # the page's own size (a window's includes its frame)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": SCREEN[0], "height": SCREEN[1],
                                                                  "deviceScaleFactor": 1, "mobile": False})
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


def _headline(driver) -> dict:
    """The headline at the top of the page as shown: title, layout label, verdict (and its colour),
    figures, and the line under them."""
    from selenium.webdriver.common.by import By

    box = driver.find_element(By.CSS_SELECTOR, ".st-key-headline")
    heading = box.find_element(By.TAG_NAME, "h4")
    badge = heading.find_element(By.CSS_SELECTOR, ".stMarkdownBadge")
    figures = {m.find_element(By.CSS_SELECTOR, '[data-testid="stMetricLabel"]').text:
               m.find_element(By.CSS_SELECTOR, '[data-testid="stMetricValue"]').text
               for m in box.find_elements(By.CSS_SELECTOR, '[data-testid="stMetric"]')}
    texts = [e.text for e in box.find_elements(By.CSS_SELECTOR, '[data-testid="stMarkdown"] p')]  # not the figures'
    rgb = [int(x) for x in re.findall(r"\d+", badge.value_of_css_property("color"))[:3]]
    return {"title": texts[0], "label": heading.find_element(By.TAG_NAME, "code").text, "verdict": badge.text,
            "rgb": rgb, "figures": figures, "lines": texts[1:]}


def _headline_is(label: str):
    def check(driver):
        try:
            return _headline(driver)["label"] == label
        except Exception:  # not drawn yet, or redrawn while read
            return False
    return check


def _png_size(path: Path) -> tuple:
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_dashboard_in_a_real_browser(app_url, browser, tmp_path):
    from selenium.webdriver.common.by import By

    out = io.StringIO()
    argv = ["recommend", "--model", "llama-3-8b", "--gpus", "32", "--top", "10"]
    assert cli.main([*argv, "--json"], out=out) == 0
    answer = json.loads(out.getvalue())
    # the CLI's answer: its first line's layout (#1, whose peak clears the band here) and best other engine
    assert answer["clear_fit"] is None
    first = answer["layouts"][0]
    best = max((e for e in answer["engines"] if e["layout"]), key=lambda e: e["relative_speed"])
    text = io.StringIO()
    assert cli.main(argv, out=text) == 0
    assert text.getvalue().startswith(f"launch {short(first['layout'])}: ")

    browser.get(app_url)
    _wait_for(browser, lambda d: _headline(d)["label"], what="first answer")
    _choose(browser, "Catalog model", "llama-3-8b")
    _set_number(browser, "GPUs", 32)
    _wait_for(browser, _headline_is(short(first["layout"])), what=f"the CLI's layout {short(first['layout'])!r}")
    head = _headline(browser)
    assert head["title"] == "Chosen layout: #1 of 10, deepspeed"
    assert head["verdict"] == first["memory"]["verdict"] == "fits"
    assert head["rgb"][1] > max(head["rgb"][0], head["rgb"][2])  # fits in green
    assert head["figures"]["Tokens/s"] == f"{first['throughput']['tokens_per_s']:,.0f}"
    assert head["figures"]["MFU"] == f"{first['throughput']['mfu']:.1%}"
    # the other engines follow the first answer
    engine_line = (f"Best other engine: {best['engine']}, {report.ratio_text(best['relative_speed'])} than #1 "
                   f"({best['tokens_per_s']:,.0f} tokens/s): {short(best['layout'])}")
    _wait_for(browser, lambda d: _headline(d)["lines"] == [engine_line], what="the best other engine")
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "Traceback" not in body
    # the CLI's legend of the layout abbreviations, for the labels on the page (table, other engines)
    lines = text.getvalue().splitlines()
    k = next(k for k, line in enumerate(lines) if line.startswith("legend: "))
    folded = [lines[k], *itertools.takewhile(lambda line: line.startswith("    "), lines[k + 1:])]
    legend = " ".join(" ".join(folded).split())
    assert legend in [c.text for c in browser.find_elements(By.CSS_SELECTOR, '[data-testid="stCaptionContainer"]')]

    # three Vega charts (memory per stage, step time, speed against memory), each drawn with a size
    # and its legend inside it (none cut off at this width)
    def drawn(d):
        charts = d.find_elements(By.CSS_SELECTOR, '[data-testid="stVegaLiteChart"]')
        sizes = [d.execute_script(
            "const c = arguments[0], svg = c.querySelector('svg.marks'); if (!svg) return null;"
            "const r = c.getBoundingClientRect();"
            "return {chart: [r.left, r.top, r.right, r.bottom], legends: [...svg.querySelectorAll('g.role-legend')]"
            ".map(g => { const b = g.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; })};", c)
            for c in charts]
        ready = len(sizes) == 3 and all(x and x["legends"] and x["chart"][2] - x["chart"][0] > 50
                                        and x["chart"][3] - x["chart"][1] > 50 for x in sizes)
        return sizes if ready else False

    for chart in _wait_for(browser, drawn, what="three drawn charts with legends"):
        left, top, right, bottom = chart["chart"]
        for legend in chart["legends"]:
            assert left <= legend[0] and legend[2] <= right + 0.5 and top <= legend[1] and legend[3] <= bottom + 0.5, \
                (chart, legend)

    browser.execute_script("window.scrollTo(0, 0); document.activeElement && document.activeElement.blur()")
    time.sleep(1.0)  # let the page settle before the picture
    target = Path(os.environ.get("PLANNER_SCREENSHOT_DIR", tmp_path)) / "dashboard.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(target))
    assert target.stat().st_size > 20_000  # a rendered page, not a blank one
    assert _png_size(target) == SCREEN

    # a click on the table's second row makes it the chosen layout
    second = short(answer["layouts"][1]["layout"])
    grid = browser.find_element(By.CSS_SELECTOR, '[data-testid="stDataFrame"]')
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", grid)
    time.sleep(0.5)
    from selenium.webdriver.common.action_chains import ActionChains

    top_left = (-grid.size["width"] // 2, -grid.size["height"] // 2)  # offsets are from the element's centre
    row_px = 35  # glide-data-grid's default header and row height in Streamlit
    ActionChains(browser).move_to_element_with_offset(grid, top_left[0] + 20, top_left[1] + row_px + row_px + row_px // 2) \
        .click().perform()
    _wait_for(browser, _headline_is(second), what=f"row 2 ({second!r}) chosen by a click")
    assert _headline(browser)["title"] == "Chosen layout: #2 of 10, deepspeed"


def test_an_uploaded_config_with_nonsense_values_is_a_message(app_url, browser, tmp_path):
    from selenium.webdriver.common.by import By

    browser.get(app_url)
    _wait_for(browser, lambda d: _headline(d)["label"], what="first answer")
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
    _wait_for(browser, lambda d: _headline(d)["label"], what="answer again")
