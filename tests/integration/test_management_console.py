"""The web console in a real headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by Selenium, ``tests.helpers.browser``): browse, purge and
retry by clicking, and what the page shows afterwards. Screenshots of each page go to
the test's tmp directory (``AMQLITE_SCREENSHOTS=DIR`` keeps them elsewhere). The live
parts (charts, takeover, send form, scheduled) are test_management_live.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.broker_proc import BrokerFactory, BrokerProcess, ClientPool, unique
from tests.helpers.browser import PAGE_WAIT, accept_confirm, click, require_browser, text_of
from tests.helpers.mgmt import Api, start_with_http, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

require_browser()

from selenium.webdriver.common.by import By  # noqa: E402


@pytest.fixture(scope="module")
def broker(module_factory: BrokerFactory) -> BrokerProcess:
    return start_with_http(module_factory, "console", env={"AMQLITE_MAX_REDELIVERIES": "0"})


def fill_queue(broker: BrokerProcess, clients: ClientPool, dest: str,
               bodies: list[str]) -> Api:
    """Send ``bodies`` to ``dest`` and wait until the API counts them waiting; the API."""
    producer = clients(broker.port)
    for body in bodies:
        producer.send(dest, body)
    api = Api(broker.http)  # type: ignore[attr-defined]
    wait_until(lambda: (d := api.destination(dest)) and d["waiting"] == len(bodies),
               what=f"{len(bodies)} waiting")
    return api


def test_overview_shows_group_and_live_depths(broker: BrokerProcess, browser,
                                              clients: ClientPool, shots: Path) -> None:
    dest = f"/queue/{unique('ui-over')}"
    browser.get(broker.http + "/#/")  # type: ignore[attr-defined]
    wait_until(lambda: "master" in text_of(browser, "#group"), PAGE_WAIT, "group table")
    assert "console" in text_of(browser, "#group")
    assert "last takeover" in text_of(browser, "#takeover")
    producer = clients(broker.port)
    for i in range(2):
        producer.send(dest, f"o{i}")
    # the page refreshes itself: the new queue appears with its depth, no reload
    row = f'#destinations tr[data-name="{dest}"]'
    wait_until(lambda: text_of(browser, row).split()[:3] == [dest, "queue", "2"], PAGE_WAIT,
               "the live depth")
    browser.save_screenshot(str(shots / "overview-destinations.png"))


def test_browse_then_purge_by_clicking(broker: BrokerProcess, browser, clients: ClientPool,
                                       shots: Path) -> None:
    dest = f"/queue/{unique('ui-purge')}"
    api = fill_queue(broker, clients, dest, [f"purge-me-{i}" for i in range(3)])
    browser.get(broker.http + "/#/")  # type: ignore[attr-defined]
    click(browser, f'#destinations tr[data-name="{dest}"] a')
    wait_until(lambda: "purge-me-2" in text_of(browser, "#messages"), PAGE_WAIT, "browse")
    assert text_of(browser, "#stats").startswith("3 waiting")
    bodies = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#messages td.body")]
    assert bodies == ["purge-me-0", "purge-me-1", "purge-me-2"]
    browser.save_screenshot(str(shots / "destination.png"))
    click(browser, "#messages tbody tr a")  # one whole message
    wait_until(lambda: text_of(browser, "#body") == "purge-me-0", PAGE_WAIT, "message page")
    browser.save_screenshot(str(shots / "message.png"))
    browser.back()
    click(browser, "#purge")
    accept_confirm(browser)
    wait_until(lambda: "No messages." in text_of(browser, "#empty"), PAGE_WAIT, "empty queue")
    assert '"purged":3' in text_of(browser, "#flash")
    assert api.destination(dest)["waiting"] == 0  # type: ignore[index]
    # the totals line counts the purge (kept in the store: issue 27)
    wait_until(lambda: "3 enqueued" in (t := text_of(browser, "#stats")) and "3 purged" in t,
               PAGE_WAIT, "the purge counted")
    browser.get(broker.http + "/#/")  # type: ignore[attr-defined]
    header = f'#destinations tr[data-name="{dest}"]'
    wait_until(lambda: text_of(browser, header), PAGE_WAIT, "the overview row")
    labels = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#destinations th")]
    assert {"enqueued", "dequeued", "expired", "dead-lettered", "moved", "purged",
            "dropped"} <= set(labels)


def test_delete_a_queue_by_clicking(broker: BrokerProcess, browser, clients: ClientPool,
                                   shots: Path) -> None:
    """The destination page's delete button removes the queue and its messages; the page
    goes back to the overview, which no longer lists it."""
    dest = f"/queue/{unique('ui-del')}"
    api = fill_queue(broker, clients, dest, ["doomed-0", "doomed-1"])
    browser.get(broker.http + "/#/" + dest.lstrip("/"))  # type: ignore[attr-defined]
    wait_until(lambda: "doomed-1" in text_of(browser, "#messages"), PAGE_WAIT, "browse")
    assert text_of(browser, "#delete-destination") == "Delete queue"
    click(browser, "#delete-destination")
    accept_confirm(browser)
    wait_until(lambda: '"deleted":1' in text_of(browser, "#flash"), PAGE_WAIT, "deleted")
    assert '"messages":2' in text_of(browser, "#flash")
    wait_until(lambda: "master" in text_of(browser, "#group"), PAGE_WAIT, "the overview")
    assert dest not in text_of(browser, "#destinations")
    assert api.destination(dest) is None
    browser.save_screenshot(str(shots / "deleted.png"))


def test_retry_dead_letters_by_clicking(broker: BrokerProcess, browser, clients: ClientPool,
                                        shots: Path) -> None:
    dest = f"/queue/{unique('ui-retry')}"
    consumer = clients(broker.port)
    consumer.subscribe(dest, ack="client-individual")
    clients(broker.port).send(dest, "bounce")
    [msg] = consumer.listener.wait_messages(1)
    consumer.nack(msg)  # max_redeliveries = 0: dead-lettered at once
    consumer.unsubscribe(consumer.subscriptions[0])
    api = Api(broker.http)  # type: ignore[attr-defined]
    wait_until(lambda: any(m["headers"].get("original-destination") == dest for m in api.ok(
        "GET", "/api/v1/messages/queue/DLQ?limit=500")["messages"]), what="the dead letter")
    browser.get(broker.http + "/#/")  # type: ignore[attr-defined]
    click(browser, "#nav-dlq")
    row = wait_until(lambda: [r for r in browser.find_elements(By.CSS_SELECTOR,
                                                               "#messages tbody tr")
                              if dest in r.text], PAGE_WAIT, "the dead letter")[0]
    browser.save_screenshot(str(shots / "dead-letters.png"))
    row.find_element(By.CSS_SELECTOR, "input.pick").click()
    click(browser, "#retry-selected")
    wait_until(lambda: f'"{dest}":1' in text_of(browser, "#flash"), PAGE_WAIT, "retry result")
    wait_until(lambda: dest not in text_of(browser, "#messages"), PAGE_WAIT, "row gone")
    again = clients(broker.port)
    again.subscribe(dest)
    assert [m.body for m in again.listener.wait_messages(1)] == ["bounce"]


def test_connections_page_closes_a_connection(broker: BrokerProcess, browser,
                                              clients: ClientPool, shots: Path) -> None:
    cid = unique("ui-conn")
    client = clients(broker.port, headers={"client-id": cid})
    browser.get(broker.http + "/#/connections")  # type: ignore[attr-defined]
    row = wait_until(lambda: [r for r in browser.find_elements(By.CSS_SELECTOR,
                                                               "#connections tbody tr")
                              if cid in r.text], PAGE_WAIT, "the connection row")[0]
    browser.save_screenshot(str(shots / "connections.png"))
    row.find_element(By.CSS_SELECTOR, "button.close").click()
    accept_confirm(browser)
    assert client.listener.wait_for(lambda: client.listener.disconnected)
    wait_until(lambda: cid not in text_of(browser, "#connections"), PAGE_WAIT, "row gone")
