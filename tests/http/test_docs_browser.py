"""The API reference page (/docs) and the root (/) in a real headless browser (tests/plugins/
browser.py, against the server of tests/http/conftest.py): / leads to the dashboard, and /docs
renders every operation of the server's own OpenAPI document, filters them, and links each body
and answer to its schema. Served from the package: the page fetches nothing but this server's
routes (its Content-Security-Policy allows no other)."""

from __future__ import annotations

import httpx
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.http.live import LiveServer
from tests.support.browser import wait_for


def shown(driver: WebDriver, css: str) -> list[str]:
    found: list[str] = driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].filter(e => !e.hidden).map(e => e.id);", css
    )
    return found


def test_root_leads_to_the_dashboard_and_docs_render_the_spec(browser: WebDriver, server: LiveServer) -> None:
    browser.get(f"{server.url}/")
    wait_for(browser, "the dashboard", lambda d: d.current_url == f"{server.url}/dashboard")
    assert browser.title == "pgbroker dashboard"

    spec = httpx.get(f"{server.url}/openapi.json").json()
    operations = {f"op-{op['operationId']}" for ops in spec["paths"].values() for op in ops.values()}
    browser.get(f"{server.url}/docs")
    wait_for(browser, "every operation", lambda d: set(shown(d, "#operations article")) == operations)
    assert browser.title == "pgbroker API reference"
    card = browser.find_element(By.ID, "op-dead_letter")
    assert "/v1/queues/{queue}/dead-letters/{msg_id}" in card.text
    assert "Needs a key with scope 'read'" in card.text
    assert "dead_letter_not_found" in card.text
    # The answer links to its schema, which lists its fields.
    card.find_element(By.CSS_SELECTOR, 'a[href="#schema-Message"]').click()
    schema = browser.find_element(By.ID, "schema-Message")
    assert "msg_id" in schema.text
    assert "headers" in schema.text

    browser.find_element(By.ID, "filter").send_keys("dead-letters")
    wait_for(browser, "the filter", lambda d: len(shown(d, "#operations article")) == 4)
    assert all("dead" in op for op in shown(browser, "#operations article"))
