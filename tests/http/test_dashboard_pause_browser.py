"""The dashboard's pause/resume control in a real headless browser (tests/plugins/browser.py,
against the server of tests/http/conftest.py): an admin key's button pauses the queue, the row
says so, reads return nothing, and the same button resumes it."""

from __future__ import annotations

from typing import Any

import psycopg
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from pgbroker._db.api_keys import create_key
from tests.http.live import LiveServer
from tests.support.browser import row_text, use_key, wait_for

QUEUE = "dash_pause"


def test_the_pause_button_pauses_and_resumes_the_queue(
    browser: WebDriver, server: LiveServer, conn: psycopg.Connection[Any]
) -> None:
    _, admin = create_key(conn, "dashboard-admin", scopes=["admin"])
    conn.execute("SELECT pgmq.create(%s)", (QUEUE,))
    conn.execute("SELECT pgmq.send(%s, '{}')", (QUEUE,))
    browser.get(f"{server.url}/dashboard?refresh=400")
    use_key(browser, admin)
    toggle = f'tr[data-queue="{QUEUE}"] button[data-action=pause-toggle]'
    wait_for(browser, "the pause button", lambda d: row_text(d, toggle) == "pause")

    browser.find_element(By.CSS_SELECTOR, toggle).click()
    wait_for(browser, "the resume button", lambda d: row_text(d, toggle) == "resume")
    row = browser.find_element(By.CSS_SELECTOR, f'tr[data-queue="{QUEUE}"]')
    assert "paused" in (row.get_attribute("class") or "")
    assert conn.execute("SELECT paused FROM pgbroker.policy(%s)", (QUEUE,)).fetchone() == (True,)
    assert conn.execute("SELECT * FROM pgmq.read(%s, 30, 1)", (QUEUE,)).fetchall() == []

    browser.find_element(By.CSS_SELECTOR, toggle).click()
    wait_for(browser, "the pause button again", lambda d: row_text(d, toggle) == "pause")
    assert conn.execute("SELECT paused FROM pgbroker.policy(%s)", (QUEUE,)).fetchone() == (False,)
    assert len(conn.execute("SELECT * FROM pgmq.read(%s, 30, 1)", (QUEUE,)).fetchall()) == 1
