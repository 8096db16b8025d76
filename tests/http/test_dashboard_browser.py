"""The dashboard in a real headless browser: Debian's chromium, driven through its chromedriver by
Selenium, against ``pgbroker serve`` on loopback and a real database.

It loads, lists a queue the test made, its depth chart follows sends and its throughput chart
follows acks, it shows dead letters, and an admin key's purge and replay buttons work (a read-only
key gets none). The message browser pages through a queue's messages by state, shows one with
its headers and body, deletes one and replays a dead letter; the schedules panel lists schedules
and pauses and resumes one (admin keys only). A screenshot is saved to tests/http/artifacts/
(dashboard-browser.png; not in git; docs/ops/ holds the ones docs/operations.md shows, with
those of test_dashboard_daily_browser.py).

No chromium is not a skip: `make test` installs it when it can (root with apt-get); otherwise
this test fails and says how to install it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from selenium.common.exceptions import NoAlertPresentException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from pgbroker import Broker
from pgbroker._db.api_keys import create_key
from tests.http.live import LiveServer
from tests.support.browser import row_text, use_key, wait_for

ARTIFACTS = Path(__file__).parent / "artifacts"
QUEUE = "dash_jobs"


def series(driver: WebDriver, chart: str, kind: str) -> dict[str, Any] | None:
    """The queue's line on a chart, as the page drew it: last value, points, largest value."""
    found: dict[str, Any] | None = driver.execute_script(
        """
        const [chart, kind, queue] = arguments;
        const path = document.querySelector(`#${chart} path.${kind}[data-queue="${queue}"]`);
        if (!path) return null;
        const ys = [...path.getAttribute("d").matchAll(/[ML][^,]+,([-0-9.]+)/g)].map(m => Number(m[1]));
        return {last: Number(path.dataset.last), points: Number(path.dataset.points),
                lowest_y: Math.min(...ys), baseline_y: Math.max(...ys)};
        """,
        chart,
        kind,
        QUEUE,
    )
    return found


def line_where(
    chart: str, kind: str, check: Callable[[dict[str, Any]], bool]
) -> Callable[[WebDriver], dict[str, Any] | None]:
    """A wait_for condition: the queue's line on the chart, once ``check`` holds for it."""

    def condition(driver: WebDriver) -> dict[str, Any] | None:
        found = series(driver, chart, kind)
        return found if found is not None and check(found) else None

    return condition


def accept_confirm(driver: WebDriver) -> None:
    def alert_accepted(d: WebDriver) -> bool:
        try:
            d.switch_to.alert.accept()
        except NoAlertPresentException:
            return False
        return True

    wait_for(driver, "the confirmation dialog", alert_accepted, timeout=5)


def test_dashboard_in_a_real_browser(
    browser: WebDriver, server: LiveServer, conn: psycopg.Connection[Any]
) -> None:
    _, admin = create_key(conn, "dashboard-admin", scopes=["admin"])
    _, reader = create_key(conn, "dashboard-reader", scopes=["read"], groups=["billing"])
    conn.execute("SELECT pgmq.create(%s)", (QUEUE,))

    browser.get(f"{server.url}/dashboard?refresh=400")
    assert browser.title == "pgbroker dashboard"
    use_key(browser, admin)
    wait_for(browser, "the queue's row", lambda d: row_text(d, f'tr[data-queue="{QUEUE}"]'))
    before = wait_for(browser, "the depth line", lambda d: series(d, "chart-depth", "depth"))
    assert before["last"] == 0
    assert "admin" in browser.find_element(By.ID, "who").text
    assert "groups" not in browser.find_element(By.ID, "who").text  # every group: not worth a word

    conn.execute("SELECT pgmq.send_batch(%s, array_fill('{\"n\": 1}'::jsonb, ARRAY[25]))", (QUEUE,))
    after = wait_for(
        browser,
        "the depth chart to show 25 messages",
        line_where("chart-depth", "depth", lambda s: s["last"] == 25),
    )
    assert after["points"] > before["points"]
    assert after["lowest_y"] < after["baseline_y"]  # the line rose: 25 is drawn above 0

    # Consume some: the throughput chart's consumed line leaves zero.
    conn.execute("SELECT pgmq.delete(%s, array_agg(msg_id)) FROM pgmq.read(%s, 30, 10)", (QUEUE, QUEUE))
    wait_for(
        browser,
        "the throughput chart to show consumption",
        line_where("chart-throughput", "consumed", lambda s: bool(s["lowest_y"] < s["baseline_y"])),
    )

    # A poison message: dead-lettered on its first failure, shown with its error.
    queue = Broker(connection=conn).queue(QUEUE)
    queue.set_policy(max_deliveries=1)
    [poison] = queue.read_many(1)
    assert queue.fail(poison, error="boom") == "dead_lettered"
    browser.find_element(
        By.CSS_SELECTOR, f'tr[data-queue="{QUEUE}"] button[data-action=show-dead-letters]'
    ).click()
    wait_for(browser, "the dead letter", lambda d: row_text(d, "#dead-letters tbody tr td.error") == "boom")
    assert json.loads(row_text(browser, "#dead-letters tbody tr td.message")) == {"n": 1}
    dead_letters = f'tr[data-queue="{QUEUE}"] td.dead-letters'
    wait_for(browser, "the dead-letter count", lambda d: row_text(d, dead_letters) == "1")

    # Admin actions: purge (in the queue's panel, not on its row) empties the queue, replay
    # brings the dead letter back.
    assert not browser.find_elements(By.CSS_SELECTOR, "#queues button[data-action=purge]")
    browser.find_element(By.CSS_SELECTOR, f'tr[data-queue="{QUEUE}"] button[data-action=browse]').click()
    click(browser, "#br-queue-actions button[data-action=purge]")
    accept_confirm(browser)
    wait_for(browser, "the purge", line_where("chart-depth", "depth", lambda s: s["last"] == 0))
    assert conn.execute("SELECT queue_length FROM pgmq.metrics(%s)", (QUEUE,)).fetchone() == (0,)
    browser.find_element(By.CSS_SELECTOR, f'tr[data-queue="{QUEUE}"] button[data-action=replay]').click()
    accept_confirm(browser)
    wait_for(browser, "the replay", line_where("chart-depth", "depth", lambda s: s["last"] == 1))
    wait_for(browser, "the dead letters to empty", lambda d: d.find_element(By.ID, "dl-empty").is_displayed())

    # A read-only key sees the queue but gets no admin buttons.
    use_key(browser, reader)
    wait_for(browser, "the reader's view", lambda d: "dashboard-reader" in d.find_element(By.ID, "who").text)
    assert "(groups billing)" in browser.find_element(By.ID, "who").text
    wait_for(browser, "the queue's row", lambda d: row_text(d, f'tr[data-queue="{QUEUE}"]'))
    assert not browser.find_elements(By.CSS_SELECTOR, "button[data-action=purge]")
    assert not browser.find_elements(By.CSS_SELECTOR, "button[data-action=replay]")


# -- the message browser and the schedules panel -------------------------------------------------


def cells(driver: WebDriver, css: str) -> list[str]:
    found: list[str] = driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent);", css
    )
    return found


def click(driver: WebDriver, css: str) -> None:
    """Click the element once it can be clicked (a table being drawn again is not, for a moment)."""

    def clicked(d: WebDriver) -> bool:
        try:
            d.find_element(By.CSS_SELECTOR, css).click()
        except WebDriverException:
            return False
        return True

    wait_for(driver, f"{css} to be clickable", clicked, timeout=5)


def test_message_browser_and_schedules_in_a_real_browser(
    browser: WebDriver, server: LiveServer, conn: psycopg.Connection[Any]
) -> None:
    _, admin = create_key(conn, "dashboard-admin", scopes=["admin"])
    _, reader = create_key(conn, "dashboard-reader", scopes=["read"])
    broker = Broker(connection=conn)
    queue = broker.create_queue(QUEUE)
    queue.set_policy(max_deliveries=1)
    ids = queue.send_many(
        [{"order": n, "sku": f"A-{n:03}"} for n in range(24)],
        headers=[{"tenant": "acme" if n % 3 else "globex", "trace": f"t-{n}"} for n in range(24)],
    )
    queue.send({"order": 99}, delay=3600)
    [poison] = queue.read_many(1)  # the oldest, dead-lettered on its first failure
    assert queue.fail(poison, error="card declined") == "dead_lettered"
    [leased] = queue.read_many(1, vt=600)  # in flight
    broker.add_schedule("nightly-report", QUEUE, "0 3 * * *", {"report": "daily"}, timezone="Europe/Berlin")
    broker.add_schedule("every-minute", QUEUE, "* * * * *", {"ping": True})

    browser.set_window_size(1400, 1800)
    browser.get(f"{server.url}/dashboard?refresh=500")
    use_key(browser, admin)
    wait_for(browser, "the queue's row", lambda d: row_text(d, f'tr[data-queue="{QUEUE}"]'))

    # The browser: a page of 20 (waiting, in flight and delayed together), then the rest.
    click(browser, f'tr[data-queue="{QUEUE}"] button[data-action=browse]')
    wait_for(browser, "the first page", lambda d: len(cells(d, "#br-list tbody td.msg-id")) == 20)
    assert cells(browser, "#br-list tbody td.msg-id")[0] == str(leased.msg_id)
    assert cells(browser, "#br-list tbody td.state")[:2] == ["in_flight", "waiting"]
    browser.find_element(By.ID, "br-next").click()
    wait_for(browser, "the second page", lambda d: cells(d, "#br-list tbody td.state")[-1:] == ["delayed"])
    assert len(cells(browser, "#br-list tbody td.msg-id")) == 4  # 23 waiting or in flight + 1 delayed
    assert not browser.find_element(By.ID, "br-next").is_enabled()

    # Filter by state, open a message: its headers and body.
    click(browser, "#br-state option[value=in_flight]")
    click(browser, "#br-filter button[type=submit]")
    wait_for(
        browser,
        "the in-flight message",
        lambda d: cells(d, "#br-list tbody td.msg-id") == [str(leased.msg_id)],
    )
    click(browser, "#br-list tbody tr")
    wait_for(browser, "the detail view", lambda d: d.find_element(By.ID, "br-detail").is_displayed())
    assert json.loads(row_text(browser, "#br-headers")) == {"tenant": "acme", "trace": "t-1"}
    assert json.loads(row_text(browser, "#br-body")) == {"order": 1, "sku": "A-001"}
    # Peeking took nothing: the message was read once, by the test.
    [shown] = queue.peek(1, after=leased.msg_id - 1)
    assert shown.read_ct == 1

    # The dead letter: shown with its error in the headers, replayed into the queue.
    click(browser, "#br-state option[value=dead]")
    click(browser, "#br-filter button[type=submit]")
    wait_for(browser, "the dead letter", lambda d: cells(d, "#br-list tbody td.state") == ["dead"])
    click(browser, "#br-list tbody tr")
    wait_for(browser, "its detail", lambda d: "card declined" in row_text(d, "#br-headers"))
    wait_for(browser, "the schedules", lambda d: len(cells(d, "#schedules tbody tr")) == 2)
    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "dashboard-browser.png"
    browser.execute_script("document.getElementById('browser').scrollIntoView()")
    browser.save_screenshot(str(screenshot))
    print(f"message browser screenshot: {screenshot}")
    click(browser, "#br-actions button[data-action=replay-message]")
    wait_for(browser, "the replay", lambda d: d.find_element(By.ID, "br-empty").is_displayed())
    assert queue.peek(state="dead") == []
    [replayed] = queue.peek(1, after=ids[-1] + 1)  # after the delayed message: a new one
    assert replayed.message == {"order": 0, "sku": "A-000"}

    # Delete a waiting message from the browser.
    click(browser, "#br-state option[value=waiting]")
    click(browser, "#br-filter button[type=submit]")
    wait_for(
        browser, "the waiting messages", lambda d: cells(d, "#br-list tbody td.msg-id")[:1] == [str(ids[2])]
    )
    click(browser, "#br-list tbody tr")
    click(browser, "#br-actions button[data-action=delete-message]")
    accept_confirm(browser)
    wait_for(browser, "the deletion", lambda d: cells(d, "#br-list tbody td.msg-id")[:1] == [str(ids[3])])
    assert [m.msg_id for m in queue.peek(1, after=ids[1])] == [ids[3]]

    # Schedules: listed with their cron and zone, paused and resumed by the admin.
    row = 'tr[data-schedule="nightly-report"]'
    assert row_text(browser, f"{row} td.cron") == "0 3 * * * (Europe/Berlin)"
    click(browser, f"{row} button[data-action=toggle-schedule]")
    wait_for(browser, "the pause", lambda d: row_text(d, f"{row} td.next") == "paused")
    assert [s.paused for s in broker.schedules() if s.name == "nightly-report"] == [True]
    click(browser, f"{row} button[data-action=toggle-schedule]")
    wait_for(browser, "the resume", lambda d: row_text(d, f"{row} td.next") != "paused")
    assert [s.paused for s in broker.schedules() if s.name == "nightly-report"] == [False]

    # A read-only key browses and sees the schedules, with no delete, replay, pause or resume.
    use_key(browser, reader)
    wait_for(browser, "the reader's view", lambda d: "dashboard-reader" in d.find_element(By.ID, "who").text)
    wait_for(browser, "the schedules", lambda d: len(cells(d, "#schedules tbody tr")) == 2)
    click(browser, f'tr[data-queue="{QUEUE}"] button[data-action=browse]')
    wait_for(browser, "the first page", lambda d: len(cells(d, "#br-list tbody td.msg-id")) == 20)
    click(browser, "#br-list tbody tr")
    wait_for(browser, "the detail view", lambda d: d.find_element(By.ID, "br-detail").is_displayed())
    assert not browser.find_elements(By.CSS_SELECTOR, "#br-actions button")
    assert not browser.find_elements(By.CSS_SELECTOR, "button[data-action=toggle-schedule]")
