"""A headless browser for the dashboard tests: Debian's chromium, driven through its chromedriver
by Selenium. A test that asks for ``browser`` is marked ``browser`` (tests/plugins/services.py).

No chromium is not a skip: `make test` installs it when it can (root with apt-get); otherwise
the test fails and says how to install it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not installed: the dashboard test needs Debian's chromium and its"
            " driver. Install them with `sudo apt-get install -y chromium chromium-driver` (or run"
            " `make test` as root, which does it).",
            pytrace=False,
        )
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1100"):
        options.add_argument(argument)
    # An explicit driver path: Selenium Manager must not go looking for (or download) another.
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()
