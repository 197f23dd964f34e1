"""The console's destination page shows the policy that applies (amqlite.policy), in a
real headless Chromium (tests.helpers.browser)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.broker_proc import BrokerFactory, BrokerProcess, ClientPool, unique
from tests.helpers.browser import PAGE_WAIT, require_browser, text_of
from tests.helpers.mgmt import start_with_http, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

require_browser()

POLICY = """
[[policy]]
destination = "/queue/shown.>"
max_length = 7
overflow = "reject-publish"
redelivery_delay = 2
"""


@pytest.fixture(scope="module")
def broker(module_factory: BrokerFactory, tmp_path_factory: pytest.TempPathFactory
           ) -> BrokerProcess:
    conf = tmp_path_factory.mktemp("console-policy") / "policy.toml"
    conf.write_text(POLICY)
    return start_with_http(module_factory, "console-policy",
                           extra_args=["--config", str(conf)])


def test_destination_page_shows_its_policy(broker: BrokerProcess, browser,
                                           clients: ClientPool, shots: Path) -> None:
    bounded = f"/queue/shown.{unique('q')}"
    plain = f"/queue/{unique('plain')}"
    producer = clients(broker.port)
    producer.send(bounded, "x")
    producer.send(plain, "y")
    browser.get(broker.http + "/#/" + bounded.lstrip("/"))  # type: ignore[attr-defined]
    wait_until(lambda: "Policy:" in text_of(browser, "#policy"), PAGE_WAIT, "the policy line")
    text = text_of(browser, "#policy")
    assert text.startswith("Policy: /queue/shown.>: ")
    assert "max-length=7 reject-publish" in text and "delay=2s" in text
    browser.save_screenshot(str(shots / "destination-policy.png"))
    browser.get(broker.http + "/#/" + plain.lstrip("/"))  # type: ignore[attr-defined]
    wait_until(lambda: "defaults" in text_of(browser, "#policy"), PAGE_WAIT, "defaults")
    assert "dlq=/queue/DLQ redeliveries=6" in text_of(browser, "#policy")
