"""Headless Chromium for the console tests (Debian's ``chromium`` and
``chromium-driver``, driven by Selenium), and the few page helpers they share.
Screenshots go to the test's tmp directory, or to ``AMQLITE_SCREENSHOTS=DIR``
(``scripts/console-screenshots`` refreshes docs/console/ that way)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.mgmt import wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
#: Deadline for the page to show something after a click (the console refreshes every
#: 2 s; a loaded machine renders slowly).
PAGE_WAIT = 20.0
#: The window of every screenshot (docs/console/).
WINDOW = "1280,900"


def require_browser() -> None:
    """Skip the calling module unless selenium, chromium and chromedriver are there."""
    pytest.importorskip("selenium.webdriver")
    if not (os.path.exists(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.skip("chromium and chromium-driver are not installed "
                    "(scripts/install-test-deps)", allow_module_level=True)


def start_chromium(extra_args: tuple[str, ...] = ()) -> Any:
    """A headless Chromium under chromedriver (``extra_args`` for one module's needs)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-background-networking",
                "--disable-dev-shm-usage", f"--window-size={WINDOW}", *extra_args):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    return driver


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """One Chromium for every console module: each start costs 4-17 s of the suite."""
    driver = start_chromium()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def browser(chromium: Any) -> Iterator[Any]:
    """The shared Chromium, left on a blank page without cookies after the module (its
    broker is gone: the console would go on polling it)."""
    yield chromium
    chromium.delete_all_cookies()  # the console's (cookies are per host, not per port)
    chromium.get("about:blank")


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    path = Path(os.environ.get("AMQLITE_SCREENSHOTS", tmp_path))
    path.mkdir(parents=True, exist_ok=True)
    return path


def text_of(driver: Any, css: str) -> str:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return str(driver.find_element(By.CSS_SELECTOR, css).text)
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def attribute_of(driver: Any, css: str, name: str) -> str:
    """An attribute of the first element matching ``css`` ("" when there is none)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return str(driver.find_element(By.CSS_SELECTOR, css).get_attribute(name) or "")
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def click(driver: Any, css: str) -> None:
    from selenium.webdriver.common.by import By

    wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, css), PAGE_WAIT, css)
    driver.find_element(By.CSS_SELECTOR, css).click()


def accept_confirm(driver: Any) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    def alert() -> Any:
        try:
            return driver.switch_to.alert
        except NoAlertPresentException:
            return None

    wait_until(alert, PAGE_WAIT, "the confirm dialog").accept()
