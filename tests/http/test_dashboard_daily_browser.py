"""The dashboard as a tool to keep open, in a real headless browser (tests/plugins/browser.py)
against ``pgbroker serve`` sampling its history every second: charts drawn from an hour of history
kept in Postgres (and still there after a reload), the in-flight column, the workers panel with
heartbeats, a search by msg_id (a dead letter found by the id its worker logged, with the error
and traceback of every attempt), by body field and by header, retry now on a leased message, and
a bookmark opened in a new tab that gets the key from the open one, typed once.

Screenshots go to tests/http/artifacts/ (dashboard.png, dashboard-message.png; docs/ops/ holds
the ones docs/operations.md shows).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg
from selenium.common.exceptions import NoAlertPresentException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from pgbroker import Broker
from pgbroker._db.api_keys import create_key
from tests.http.live import pgbroker_serve
from tests.support.browser import row_text, use_key, wait_for

ARTIFACTS = Path(__file__).parent / "artifacts"

# An hour of samples every 10 s, as `pgbroker serve` would have recorded them: a backlog that
# rose and drained, and counters that grew (their differences are the rates drawn).
HOUR_OF_HISTORY = """
INSERT INTO pgbroker.queue_history
SELECT q.name, now() - make_interval(secs => n * 10),
       round(q.scale * (40 + 35 * sin(n / 40.0))), round(q.scale * (4 + 3 * cos(n / 25.0))),
       q.scale * (30 + 20 * sin(n / 40.0)),
       round((360 - n) * q.scale * (12 + 4 * sin(n / 30.0))), round((360 - n) * q.scale * 12),
       round((360 - n) * q.scale * (1 + 0.5 * sin(n / 20.0))), round((360 - n) * q.scale * 0.2)
FROM generate_series(1, 360) n, (VALUES ('orders', 0.75), ('emails', 0.3)) q(name, scale)
"""


def cells(driver: WebDriver, css: str) -> list[str]:
    found: list[str] = driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent);", css
    )
    return found


def points(driver: WebDriver, chart: str, kind: str, queue: str) -> int:
    found: str | None = driver.execute_script(
        "const [chart, kind, queue] = arguments;"
        ' const p = document.querySelector(`#${chart} path.${kind}[data-queue="${queue}"]`);'
        " return p ? p.dataset.points : null;",
        chart,
        kind,
        queue,
    )
    return int(found or 0)


def click(driver: WebDriver, css: str) -> None:
    def clicked(d: WebDriver) -> bool:
        try:
            d.find_element(By.CSS_SELECTOR, css).click()
        except WebDriverException:
            return False
        return True

    wait_for(driver, f"{css} to be clickable", clicked, timeout=10)


def accept_confirm(driver: WebDriver) -> None:
    def accepted(d: WebDriver) -> bool:
        try:
            d.switch_to.alert.accept()
        except NoAlertPresentException:
            return False
        return True

    wait_for(driver, "the confirmation dialog", accepted, timeout=5)


def search(driver: WebDriver, queue: str, text: str) -> None:
    click(driver, f'#se-queue option[value="{queue}"]')
    field = driver.find_element(By.ID, "se-text")
    field.clear()
    field.send_keys(text)
    click(driver, "#search button[type=submit]")


def test_a_dashboard_to_keep_open(browser: WebDriver, dsn: str, conn: psycopg.Connection[Any]) -> None:
    _, admin = create_key(conn, "ops", scopes=["admin"])
    broker = Broker(connection=conn)
    orders = broker.create_queue("orders")
    broker.create_queue("emails").send_many([{"to": f"user{n}@example.com"} for n in range(12)])
    broker.create_queue("orders_dlq").send_many(["the dead-letter queue's own"] * 5)
    orders.set_policy(
        max_deliveries=3, backoff="fixed", backoff_base_seconds=0, dead_letter_queue="orders_dlq"
    )
    conn.execute(HOUR_OF_HISTORY)
    # A poison order: three failed attempts, each with its traceback, then dead-lettered.
    poison = orders.send({"order": 7, "sku": "X-999"}, headers={"tenant": "acme"})
    for delivery in (1, 2, 3):
        conn.execute("UPDATE pgmq.q_orders SET vt = now() - interval '1 s'")
        [message] = orders.read_many(1)
        trace = (
            "Traceback (most recent call last):\n"
            f'  File "shop.py", line {40 + delivery}, in ship\n'
            "    stock[message.message['sku']] -= 1\n"
            "KeyError: 'X-999'\n"
        )
        orders.fail(message, error="KeyError: 'X-999'", traceback=trace)
    ids = orders.send_many(
        [{"order": n, "sku": f"A-{n:03}"} for n in range(30)],
        headers=[{"tenant": "acme" if n % 2 else "globex"} for n in range(30)],
    )
    leased = orders.read_many(4, vt=600)  # in flight
    conn.execute(
        "SELECT pgbroker.worker_heartbeat('orders', %s, 'worker-1', 4242, 8, 4, 1280, 12, 1)", (uuid.uuid4(),)
    )

    with pgbroker_serve(dsn, "--rate", "1000", "--burst", "1000", "--history-interval", "1s") as server:
        browser.set_window_size(1400, 1500)
        browser.get(f"{server.url}/dashboard?refresh=500&window=60")
        use_key(browser, admin)
        # The charts start with the hour the server kept, not empty.
        wait_for(browser, "an hour of depth", lambda d: points(d, "chart-depth", "depth", "orders") > 200)
        assert points(browser, "chart-in-flight", "in-flight", "emails") > 200
        assert points(browser, "chart-failures", "retried", "orders") > 200
        in_flight = 'tr[data-queue="orders"] td.in-flight'
        wait_for(browser, "the in-flight column", lambda d: row_text(d, in_flight) == "4")
        wait_for(browser, "the worker", lambda d: cells(d, "#queue-workers td.process") == ["worker-1:4242"])
        assert cells(browser, "#queue-workers td.holding") == ["4"]
        ARTIFACTS.mkdir(exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "dashboard.png"))

        # A reload keeps the key (this tab's session) and the history.
        browser.refresh()
        wait_for(browser, "the history again", lambda d: points(d, "chart-depth", "depth", "orders") > 200)

        # The dead letter, found by the msg_id its worker logged, with every attempt.
        search(browser, "orders", str(poison))
        wait_for(browser, "the dead letter", lambda d: cells(d, "#br-list tbody td.state") == ["dead"])
        assert cells(browser, "#br-list tbody td.msg-id") == [str(poison)]
        wait_for(browser, "its attempts", lambda d: len(cells(d, "#br-attempts tbody tr")) == 3)
        assert cells(browser, "#br-attempts td.delivery") == ["1", "2", "3"]
        click(browser, "#br-attempts tbody tr:last-child summary")
        last_traceback = row_text(browser, "#br-attempts tbody tr:last-child pre.traceback")
        assert 'File "shop.py", line 43' in last_traceback
        browser.execute_script("document.getElementById('browser').scrollIntoView()")
        browser.save_screenshot(str(ARTIFACTS / "dashboard-message.png"))
        click(browser, "#br-actions button[data-action=replay-message]")
        wait_for(browser, "the replay", lambda d: d.find_element(By.ID, "br-empty").is_displayed())
        assert orders.dead_letters() == []

        # By body field, by header.
        search(browser, "orders", "sku=A-007")
        wait_for(browser, "the order", lambda d: cells(d, "#br-list tbody td.msg-id") == [str(ids[7])])
        search(browser, "orders", "header:tenant=acme")
        wait_for(browser, "acme's orders", lambda d: len(cells(d, "#br-list tbody td.msg-id")) == 16)

        # Retry now: a leased message is visible again at once.
        search(browser, "orders", str(leased[0].msg_id))
        wait_for(browser, "the lease", lambda d: cells(d, "#br-list tbody td.state") == ["in_flight"])
        click(browser, "#br-actions button[data-action=retry-message]")
        accept_confirm(browser)
        wait_for(browser, "the retry", lambda d: cells(d, "#br-list tbody td.state") == ["waiting"])

        # A bookmark in a new tab: no key typed, the open tab hands it over; the search reopens.
        bookmark = f"{server.url}/dashboard?refresh=500&queue=orders&find=sku%3DA-011"
        browser.switch_to.new_window("tab")
        browser.get(bookmark)
        wait_for(browser, "the key from the other tab", lambda d: "ops" in d.find_element(By.ID, "who").text)
        found = "#br-list tbody td.msg-id"
        wait_for(browser, "the bookmarked search", lambda d: cells(d, found) == [str(ids[11])])
