"""Helpers of the dashboard's browser tests: waiting on the page, reading it, entering a key."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from selenium.common.exceptions import TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

T = TypeVar("T")


def wait_for(
    driver: WebDriver, what: str, condition: Callable[[WebDriver], T | None], timeout: float = 20
) -> T:
    """The condition's first truthy result, polled every 0.1 s."""
    try:
        found: T = WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: condition(d) or False)
        return found
    except TimeoutException:
        status = driver.find_element(By.ID, "status").text
        raise AssertionError(
            f"timed out waiting for {what}; the page's status line says {status!r}"
        ) from None


def row_text(driver: WebDriver, css: str) -> str:
    text: str = driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;", css
    )
    return text


def use_key(driver: WebDriver, token: str) -> None:
    field = driver.find_element(By.ID, "key")
    field.clear()
    field.send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#key-form button[type=submit]").click()
