"""The blocking Client: same core on a background loop thread."""

from __future__ import annotations

import threading

import pytest

from amqlite.client import Client, Message
from tests.client.stomp_server import WAIT, ServerThread
from tests.helpers.client import RecordingListener


def test_blocking_client_sends_receives_acks_and_fails_over() -> None:
    with ServerThread() as st:
        url = f"failover:({st.server.uri})?randomize=false&initialReconnectDelay=20"
        listener = RecordingListener()
        with Client(url, listener=listener, producer_id="sync-p") as client:
            sub = client.subscribe("queue://q", ack="client-individual")
            sent = client.send("queue://q", "hello")
            assert sent.identity == ("sync-p", 1)
            message = sub.receive(timeout=WAIT)
            assert message is not None and message.text == "hello"
            assert message.identity == ("sync-p", 1)
            assert client.ack(message) is True
            assert sub.receive(timeout=0.05) is None  # nothing else queued

            st.do(st.server.kill_connections)
            after = client.send("queue://q", "after failover")  # waits for the reconnect
            assert after.seq == 2
            assert [f.body for f in st.do(lambda: list(st.server.stored))] == [
                b"hello", b"after failover"]
            assert len(client.interruptions) == 1
            again = sub.receive(timeout=WAIT)  # the subscription was re-sent
            assert again is not None and again.text == "after failover"
        # callbacks ran on the client's loop thread, never on the caller's
        assert listener.threads == {"amqlite-client"}
        assert listener.names() == ["resumed", "interrupted", "resumed"]


def test_callbacks_run_on_the_loop_thread_and_may_not_block_on_the_client() -> None:
    with ServerThread() as st, Client(st.server.uri) as client:
        seen: list[tuple[str, str]] = []
        errors: list[BaseException] = []
        done = threading.Event()

        def on_message(message: Message) -> None:
            seen.append((threading.current_thread().name, message.text))
            try:
                client.send("queue://other", "from a callback")
            except RuntimeError as exc:
                errors.append(exc)
            done.set()

        client.subscribe("queue://cb", callback=on_message)
        client.send("queue://cb", "ping")
        assert done.wait(WAIT)
        assert seen == [("amqlite-client", "ping")]
        assert len(errors) == 1 and "async_client" in str(errors[0])


def test_blocking_client_reports_a_bad_url_at_construction() -> None:
    with pytest.raises(ValueError, match="randomise"):
        Client("failover:(tcp://127.0.0.1:1)?randomise=false")
