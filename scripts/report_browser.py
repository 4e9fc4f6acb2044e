"""Open a run's report.html in headless Chromium, as a person would, from disk with the network off:
take a screenshot, or measure the page's size and load time. tests/test_page.py drives the page
through the same functions.

    python scripts/report_browser.py results/baseline --screenshot results/report.png
    python scripts/report_browser.py runs/x --measure        # size, load time, console errors, requests

Needs Debian's `chromium` and `chromium-driver` (`apt-get install -y chromium chromium-driver`; .ci/run
installs them) and selenium (the `test` extra). Selenium is given the driver's path, so its Selenium
Manager never runs and nothing is downloaded (docs/install.md).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# flags that work on these machines (root, no display, no GPU): no sandbox as root, and nothing that
# phones home (component updates, sync, background requests)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage")


def missing() -> str | None:
    """Why the browser cannot start here (None when it can)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists() and not shutil.which(Path(path).name):
            return f"{path} is missing: apt-get install -y chromium chromium-driver"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is missing: pip install -c constraints.txt -e '.[test]'"
    return None


def open_browser(width: int = 1360, height: int = 1000):
    """A headless Chromium with a fresh profile, logging the console and the network."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or CHROMIUM
    profile = tempfile.mkdtemp(prefix="sbd-chromium-")
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or CHROMEDRIVER), options=options)
    driver.profile_dir = profile
    return driver


def close_browser(driver) -> None:
    driver.quit()
    shutil.rmtree(driver.profile_dir, ignore_errors=True)


def load(driver, page: Path, timeout: float = 30.0) -> float:
    """Open ``page`` (a file) with the network off, wait until its script has drawn it; returns the
    milliseconds from navigation to the drawn page (the script's ``performance.now()`` at its end)."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get("about:blank")
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.emulateNetworkConditions", {"offline": True, "latency": 0, "downloadThroughput": -1,
                                                                "uploadThroughput": -1})
    driver.get_log("browser"), driver.get_log("performance")  # drop what about:blank logged
    driver.get(Path(page).resolve().as_uri())
    WebDriverWait(driver, timeout).until(
        lambda d: d.execute_script("return !!(window.sbdReport && window.sbdReport.ready)")
        or d.execute_script("return document.readyState === 'complete' && !window.sbdReport"))
    return driver.execute_script("return window.sbdReport ? window.sbdReport.loadMs : null")


def console_errors(driver) -> list[str]:
    """Console messages at error level (uncaught exceptions included) since the last call."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def requests_made(driver) -> list[str]:
    """URLs the page asked for since the last call (the page's own file included)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def outside_requests(urls: list[str], page: Path) -> list[str]:
    """The requests that leave the file: anything but the page itself and inline data."""
    own = Path(page).resolve().as_uri()
    return [u for u in urls if u != own and not u.startswith("data:")]


def screenshot(driver, path: Path, full_page: bool = True) -> None:
    """A PNG of the page, the whole height when ``full_page`` (headless Chromium draws what the window holds)."""
    if full_page:
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(driver.get_window_size()["width"], min(height + 20, 6000))
    driver.save_screenshot(str(path))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a run folder holding report.html (python -m sbd_bench report RUN_DIR writes it)")
    parser.add_argument("--screenshot", help="write a PNG of the page here")
    parser.add_argument("--height", type=int, default=1000, help="window height for --screenshot (default 1000: the top of the page)")
    parser.add_argument("--measure", action="store_true", help="print the page's size and load time (median of 3 loads)")
    args = parser.parse_args(argv)
    page = Path(args.run_dir) / "report.html"
    if not page.is_file():
        print(f"{page} does not exist: write it with `python -m sbd_bench report {args.run_dir}`", file=sys.stderr)
        return 2
    why = missing()
    if why:
        print(why, file=sys.stderr)
        return 2
    driver = open_browser(height=args.height)
    try:
        started = time.perf_counter()
        times = [load(driver, page) for _ in range(3 if args.measure else 1)]
        wall = time.perf_counter() - started
        errors, outside = console_errors(driver), outside_requests(requests_made(driver), page)
        if args.screenshot:
            screenshot(driver, Path(args.screenshot), full_page=False)
        result = {"page": str(page), "bytes": page.stat().st_size, "load_ms": sorted(times)[len(times) // 2],
                  "loads": len(times), "wall_s": round(wall, 2), "console_errors": errors, "outside_requests": outside}
        print(json.dumps(result))
        return 1 if errors or outside else 0
    finally:
        close_browser(driver)


if __name__ == "__main__":
    sys.exit(main())
