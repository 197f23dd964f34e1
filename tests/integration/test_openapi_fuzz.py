"""Issue 27, "the HTTP API described": schemathesis, driven by the OpenAPI document the
node itself serves (docs/openapi.yaml), sends generated requests, valid and invalid, to
every operation of a live broker process with a users file, an administrator's login
and the Host/Origin/X-Requested-By headers state changes need. No answer may be a 5xx,
and every answer (status, content type, body, headers) must be one the document
describes. The broker holds messages, a dead letter, a scheduled message and a durable
subscription first, so the reads and actions meet real rows, not only 404s. One fixed
seed in the suite (tests/helpers/seeds.py); AMQLITE_FUZZ_SEED=random searches afresh."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
import yaml
from schemathesis import engine
from schemathesis.engine import events
from schemathesis.specs.openapi.checks import ignored_auth

from amqlite.auth import hash_password
from amqlite.management.app import API, SLAVE_PATHS
from tests.helpers.broker_proc import (
    BrokerFactory,
    BrokerProcess,
    ClientPool,
    amqlite_command,
    cli_env,
    unique,
)
from tests.helpers.mgmt import Api, start_with_http, wait_until
from tests.helpers.seeds import fuzz_seed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: What a state change needs besides its Origin (origin.check_origin).
CSRF_HEADERS = {"X-Requested-By": "schemathesis"}
#: Answers that say the request went no further than the login, the CSRF check or the
#: router (405: schemathesis tries methods an operation does not have).
REFUSALS = frozenset({401, 403, 405, 421, 429})
DOCS = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"
ADMIN, ADMIN_PASSWORD = "root", "root-Pw-1"
#: Generated requests per operation and phase (schemathesis' default is 100): ~1,400
#: requests over the 26 operations, 18 s on the shared 2-core machine (35 s at a load
#: average of 12), while each operation still gets boundary values, invalid numbers and
#: odd names.
MAX_EXAMPLES = 40
#: The suite's seed (tests/helpers/seeds.py: AMQLITE_FUZZ_SEED=random for a fresh one).
CI_SEED = 20261126
#: A slave answers 503 to most: a few cases per operation and phase show it.
SLAVE_MAX_EXAMPLES = 5
#: [[authorization]] entries: the administrators may do everything, so every action
#: reaches the broker; the per-destination checks run on every generated name.
USERS = f"""
[users]
{ADMIN} = "{{hash}}"

[groups]
admins = ["{ADMIN}"]

[[authorization]]
destination = "/queue/>"
read = ["admins"]
write = ["admins"]
admin = ["admins"]
auto_create = true

[[authorization]]
destination = "/topic/>"
read = ["admins"]
write = ["admins"]
admin = ["admins"]
auto_create = true
"""


@pytest.fixture(scope="module")
def broker(module_factory: BrokerFactory, tmp_path_factory: pytest.TempPathFactory
           ) -> BrokerProcess:
    d = tmp_path_factory.mktemp("openapi")
    (d / "users.toml").write_text(USERS.replace("{hash}", hash_password(ADMIN_PASSWORD)))
    # max_redeliveries = 0: a NACK dead-letters at once (a DLQ to browse and retry).
    b = start_with_http(module_factory, "openapi", d / "users.toml",
                        env={"AMQLITE_MAX_REDELIVERIES": "0"})
    b.users_file = d / "users.toml"  # type: ignore[attr-defined]  # for its slave
    return b


@pytest.fixture(scope="module")
def api(broker: BrokerProcess) -> Api:
    return Api(broker.http, ADMIN, ADMIN_PASSWORD)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def seeded(broker: BrokerProcess, api: Api) -> Iterator[None]:
    """Rows for the document's examples (/queue/orders, the DLQ, a scheduled message, a
    durable subscription), and one connection that stays open."""
    pool = ClientPool()
    try:
        login = {"username": ADMIN, "passcode": ADMIN_PASSWORD}
        producer = pool(broker.port, **login)
        for i in range(5):
            producer.send("/queue/orders", f"order {i}", headers={"persistent": "true"})
        producer.send("/queue/orders", "later", headers={"AMQ_SCHEDULED_DELAY": "3600000"})
        consumer = pool(broker.port, **login)
        consumer.subscribe("/queue/orders.poison", ack="client-individual")
        producer.send("/queue/orders.poison", "poison")
        [msg] = consumer.listener.wait_messages(1)
        consumer.nack(msg)
        durable = pool(broker.port, headers={"client-id": "orders-app"}, **login)
        durable.subscribe("/topic/orders", headers={"activemq.subscriptionName": "audit"})
        durable.close()
        producer.send("/topic/orders", "news")
        wait_until(lambda: (d := api.destination("/queue/DLQ")) and d["waiting"] >= 1,
                   what="the dead letter")
        wait_until(lambda: api.ok("GET", "/api/v1/scheduled")["total"] >= 1,
                   what="the scheduled message")
        yield
    finally:
        pool.close()


def _config(base: str, max_examples: int = MAX_EXAMPLES, **extra: Any) -> schemathesis.Config:
    """The run's settings: the seed, the node, an administrator and the CSRF headers."""
    settings: dict[str, Any] = {
        "seed": fuzz_seed(CI_SEED),
        "base-url": base,
        "headers": {**CSRF_HEADERS, "Origin": base},
        "auth": {"basic": {"username": ADMIN, "password": ADMIN_PASSWORD}},
        # database none: no .hypothesis/ in the work tree. No generated Authorization
        # headers: the configured login replaces them anyway, and a "negative" case
        # without one would then be counted as accepted although it was never sent.
        "generation": {"max-examples": max_examples, "database": "none",
                       "with-security-parameters": False},
        "request-timeout": 10,
        # The document's links say which answer feeds which parameter. Schemathesis'
        # own dependency analysis guesses too, and feeds a send's message_id (the STOMP
        # message-id, a string) to /api/v1/message/{id} (the store id) as valid data.
        "phases": {"stateful": {"inference": {"algorithms": ["location-headers"]}}},
        # ignored_auth sends one wrong password after another from one address; from
        # the sixth the node answers 429 (security.FAILURES_BEFORE_THROTTLE), which the
        # check counts as a failure, and a failure ends that operation's generation.
        # test_every_operation_needs_its_login checks the same without the throttle.
        "checks": {"ignored_auth": {"enabled": False}},
        # A destination name is any text without CR, LF or NUL, and schemathesis drops
        # what it cannot put in a path ('/', '{', '}'): with some seeds most of its
        # long random names go, and Hypothesis' filter_too_much check would end the run
        # although every request it did send was answered as documented.
        "suppress-health-check": ["filter_too_much"],
        # A SEND needs one destination: a name with a wildcard element ("*", ">") is a
        # 400 (the send operation's description), which the schema of a name cannot say.
        "operations": [{"include-operation-id": "send", "checks": {
            "positive_data_acceptance": {
                "expected-statuses": ["2xx", "3xx", "400", "401", "403", "404", "409", "429",
                                      "5xx"]}}}],
    }
    for key, value in extra.items():
        settings[key] = {**settings.get(key, {}), **value}
    return schemathesis.Config.from_dict(settings)


@pytest.fixture(scope="module")
def api_schema(broker: BrokerProcess, seeded: None) -> schemathesis.BaseSchema:
    """The document as the node serves it, aimed at the node, with an administrator."""
    base: str = broker.http  # type: ignore[attr-defined]
    return schemathesis.openapi.from_url(f"{base}/api/v1/openapi.json", config=_config(base))


def test_the_node_serves_the_docs_file(broker: BrokerProcess) -> None:
    """Without a login (the users file is on): YAML byte for byte, JSON the same tree."""
    base: str = broker.http  # type: ignore[attr-defined]
    with urllib.request.urlopen(f"{base}/api/v1/openapi.yaml", timeout=10) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("application/yaml")
        assert r.read() == DOCS.read_bytes()
    with urllib.request.urlopen(f"{base}/api/v1/openapi.json", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("application/json")
        assert json.loads(r.read()) == yaml.safe_load(DOCS.read_text(encoding="utf-8"))


class Validated:
    """Requests built from the document's operations, sent with the fuzz run's headers
    and login, and checked by the same schemathesis checks: a 2xx (or the status asked
    for) whose body, content type and headers the document describes."""

    def __init__(self, schema: schemathesis.BaseSchema, api: Api) -> None:
        self.schema = schema
        assert api.auth is not None
        # A Case made by hand gets neither the config's login nor its headers.
        self.headers = {"Authorization": api.auth, **CSRF_HEADERS, "Origin": api.base}

    def __call__(self, method: str, path: str, status: int = 200,
                 **case: Any) -> Any:
        # ignored_auth's wrong passwords are throttled after five (429): the fuzz run
        # below keeps that check and tells the 429 apart.
        response = self.schema[path][method].Case(**case).call_and_validate(
            headers=self.headers, excluded_checks=[ignored_auth])
        assert response.status_code == status, f"{method} {path}: {response.text}"
        types = {k.lower(): v for k, v in response.headers.items()}.get("content-type", [""])
        return response.json() if types[0].startswith("application/json") else response.text


def test_every_success_answer_matches_the_document(broker: BrokerProcess, api: Api,
                                                   api_schema: schemathesis.BaseSchema,
                                                   clients: ClientPool) -> None:
    """Each operation once on real rows (generated requests rarely name one), so every
    2xx body the document describes is checked against what the node answers."""
    call = Validated(api_schema, api)
    login = {"username": ADMIN, "passcode": ADMIN_PASSWORD}
    q, other = unique("golden"), unique("golden-target")
    producer = clients(broker.port, **login)
    for i in range(3):
        producer.send(f"/queue/{q}", f"m{i}", headers={"priority": "7"})
    producer.send(f"/queue/{q}", b"\xff\xfe")  # type: ignore[arg-type]  # not UTF-8
    producer.send(f"/queue/{q}", "")  # SQLite's substr() of an empty BLOB is NULL
    producer.send(f"/queue/{q}", "soon", headers={"AMQ_SCHEDULED_DELAY": "3600000"})
    consumer = clients(broker.port, headers={"client-id": unique("cid")}, **login)
    consumer.subscribe(f"/queue/{q}.poison", ack="client-individual")
    producer.send(f"/queue/{q}.poison", "poison")
    consumer.nack(consumer.listener.wait_messages(1)[0])  # max_redeliveries 0: the DLQ
    topic, durable_id = unique("golden-topic"), unique("golden-cid")
    durable = clients(broker.port, headers={"client-id": durable_id}, **login)
    durable.subscribe(f"/topic/{topic}", headers={"activemq.subscriptionName": "audit"})
    durable.close()
    producer.send(f"/topic/{topic}", "news")
    # Both counts: depths and scheduled counts are cached apart (reads.DEPTH_CACHE_SECONDS).
    wait_until(lambda: (d := api.destination(f"/queue/{q}")) and d["waiting"] == 5
               and d["scheduled"] == 1, what=f"/queue/{q} waiting 5, scheduled 1")

    for path in ("/healthz", "/readyz", "/metrics", "/", "/api/v1/node", "/api/v1/group",
                 "/api/v1/destinations", "/api/v1/connections", "/api/v1/subscriptions",
                 "/api/v1/openapi.yaml"):
        call("GET", path)
    call("GET", "/static/{filename}", path_parameters={"filename": "console.js"})
    one = {"kind": "queue", "name": q}
    assert call("GET", "/api/v1/destinations/{kind}/{name}", path_parameters=one)[
        "scheduled"] == 1
    page = call("GET", "/api/v1/messages/{kind}/{name}", path_parameters=one,
                query={"limit": 3})
    assert len(page["messages"]) == 3 and page["next_after"] == page["messages"][2]["id"]
    rest = call("GET", "/api/v1/messages/{kind}/{name}", path_parameters=one,
                query={"after": page["next_after"]})
    [binary, empty] = rest["messages"]
    assert binary["body_base64"] == "//4=" and binary["body"] is None
    assert empty["body"] == "" and empty["size"] == 0 and not empty["truncated"]
    first = page["messages"][0]["id"]
    assert call("GET", "/api/v1/message/{id}", path_parameters={"id": first})["body"] == "m0"
    scheduled = call("GET", "/api/v1/scheduled", query={"destination": f"/queue/{q}"})
    [due] = scheduled["scheduled"]
    assert call("GET", "/api/v1/message/{id}", path_parameters={"id": due["id"]})[
        "deliver_at"] == due["deliver_at"]
    call("DELETE", "/api/v1/scheduled/{id}", path_parameters={"id": due["id"]})
    call("DELETE", "/api/v1/message/{id}", path_parameters={"id": first})
    second = page["messages"][1]["id"]
    moved = call("POST", "/api/v1/move/{kind}/{name}", path_parameters=one,
                 body={"to": f"/queue/{other}", "ids": [second]})
    assert moved["moved"] == 1
    dlq = call("GET", "/api/v1/messages/{kind}/{name}",
               path_parameters={"kind": "queue", "name": "DLQ"}, query={"limit": 500})
    mine = [m["id"] for m in dlq["messages"]
            if m["headers"].get("original-destination") == f"/queue/{q}.poison"]
    assert call("POST", "/api/v1/retry/{kind}/{name}",
                path_parameters={"kind": "queue", "name": "DLQ"},
                body={"ids": mine})["moved"] == 1
    assert call("POST", "/api/v1/purge/{kind}/{name}", path_parameters=one)["purged"] == 3
    assert call("DELETE", "/api/v1/destinations/{kind}/{name}",
                path_parameters={"kind": "queue", "name": other})["deleted"] == 1
    call("DELETE", "/api/v1/subscriptions/{client_id}/{name}",
         path_parameters={"client_id": durable_id, "name": "audit"})
    address = next(c["address"] for c in call("GET", "/api/v1/connections")["connections"]
                   if c["subscriptions"])
    call("DELETE", "/api/v1/connections/{address}", path_parameters={"address": address})
    # And the error shapes: a 404, a 400 and a 409, as documented.
    call("GET", "/api/v1/message/{id}", 404, path_parameters={"id": 2**62})
    call("POST", "/api/v1/move/{kind}/{name}", 400, path_parameters=one, body={"to": ""})
    status, _, _ = api.call("POST", f"/api/v1/send/queue/{q}", raw=b"\r",  # no JSON text
                            headers={"Content-Type": "application/json"})
    assert status == 400
    consumer2 = clients(broker.port, **login)
    consumer2.subscribe(f"/queue/{q}")
    wait_until(lambda: (d := api.destination(f"/queue/{q}")) and d["consumers"] == 1,
               what="the consumer")
    call("DELETE", "/api/v1/destinations/{kind}/{name}", 409, path_parameters=one)


def test_the_cli_prints_the_document_without_a_node() -> None:
    """`amqlite openapi` reads the installed document: no node, no network."""
    run = [*amqlite_command(), "openapi"]
    out = subprocess.run(run, capture_output=True, timeout=60, env=cli_env(), check=True)
    assert out.stdout == DOCS.read_bytes() and not out.stderr
    out = subprocess.run([*run, "--json"], capture_output=True, timeout=60, env=cli_env(),
                         check=True)
    assert json.loads(out.stdout) == yaml.safe_load(DOCS.read_text(encoding="utf-8"))


#: A value for each path parameter: the login is checked before anything looks at them.
PATH_VALUES = {"kind": "queue", "name": "x", "id": "1", "filename": "console.js",
               "address": "127.0.0.1:1", "client_id": "c"}


def test_every_operation_needs_its_login(broker: BrokerProcess) -> None:
    """What schemathesis' ignored_auth checks, without the login throttle in the way:
    every operation the document secures answers 401 (with the Basic challenge) to no
    login and to a wrong password; the open ones answer without one."""
    base: str = broker.http  # type: ignore[attr-defined]
    doc = yaml.safe_load(DOCS.read_text(encoding="utf-8"))
    operations = [(m.upper(), path, op) for path, item in doc["paths"].items()
                  for m, op in item.items() if m in ("get", "post", "delete")]
    assert len(operations) >= 24
    for i, (method, path, op) in enumerate(operations):
        url = path.format(**PATH_VALUES)
        # A login name per request: five wrong passwords of one name are throttled.
        for client in (Api(base), Api(base, f"nobody-{i}", "wrong")):
            status, body, headers = client.call(method, url)
            if op.get("security") == []:
                assert status not in (401, 403, 429), f"{method} {path}: {status} {body}"
            else:
                assert status == 401, f"{method} {path}: {status} {body}"
                assert headers["WWW-Authenticate"] == 'Basic realm="amqlite"'


def run_engine(schema: schemathesis.BaseSchema) -> dict[str, Counter[int]]:
    """Schemathesis' engine (what its CLI runs: its phases, every built-in check) over
    every operation of ``schema``; fails listing each failed check with the answer and
    the request that reproduces it. The answers' statuses by operation."""
    failures: list[str] = []
    errors: list[str] = []
    statuses: dict[str, Counter[int]] = {}
    finished: events.EngineFinished | None = None
    for event in engine.from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished | events.FuzzScenarioFinished):
            recorder = event.recorder
            for case_id, interaction in recorder.interactions.items():
                node = recorder.cases.get(case_id)
                label = node.value.operation.label if node is not None else recorder.label
                status = interaction.response.status_code if interaction.response else 0
                statuses.setdefault(label, Counter())[status] += 1
            for case_id, checks in recorder.checks.items():
                answer = recorder.interactions.get(case_id)
                got = (f"{answer.response.status_code} {answer.response.content[:300]!r}"
                       if answer is not None and answer.response is not None else "?")
                for check in checks:
                    if check.failure_info is not None:
                        failures.append(f"{recorder.label}: {check.name}: "
                                        f"{check.failure_info.failure.title}: "
                                        f"{check.failure_info.failure.message}\n"
                                        f"answered {got}\n"
                                        f"{check.failure_info.code_sample}")
        elif isinstance(event, events.NonFatalError | events.FatalError):
            errors.append(repr(event))
        elif isinstance(event, events.EngineFinished):
            finished = event
    assert finished is not None
    assert not errors, "\n".join(errors)
    assert not failures, (f"{len(failures)} failed checks (AMQLITE_FUZZ_SEED="
                          f"{schema.config.seed} reproduces):\n" + "\n\n".join(failures))
    total = sum(sum(c.values()) for c in statuses.values())
    print(f"schemathesis: {total} requests in {finished.running_time:.1f}s")
    for op in sorted(statuses):
        print(f"  {op}: {dict(sorted(statuses[op].items()))}")
    return statuses


def test_no_5xx_and_every_answer_documented(broker: BrokerProcess,
                                            api_schema: schemathesis.BaseSchema) -> None:
    """Every phase over every operation of the master. Every operation must also have
    been reached past the login (an answer other than a refusal), or the run proved
    little."""
    statuses = run_engine(api_schema)
    server_errors = {op: n for op, c in statuses.items() for s, n in c.items() if s >= 500}
    assert not server_errors
    operations = {r.ok().label for r in api_schema.get_all_operations()}
    reached = {op for op, c in statuses.items() if set(c) - REFUSALS}
    assert operations <= reached, f"never past the login: {sorted(operations - reached)}"
    # Its probes include a NUL in a header, which aiohttp refuses (400) and would log
    # with a traceback (httplog keeps it to one debug line).
    assert "Traceback" not in broker.log_path.read_text(errors="replace")


def test_a_slave_answers_as_documented(broker: BrokerProcess, module_factory: BrokerFactory,
                                       api: Api) -> None:
    """A slave of the same group: health, role, metrics, the group and this document
    answer; every other operation is the documented 503 naming the master. A short run
    (no stateful phase: nothing a slave answers leads anywhere)."""
    slave = start_with_http(module_factory, "openapi-slave",
                            broker.users_file,  # type: ignore[attr-defined]
                            data_dir=broker.data_dir, wait=False)
    base: str = slave.http  # type: ignore[attr-defined]
    admin = Api(base, ADMIN, ADMIN_PASSWORD)
    wait_until(admin.up, what="the slave's listener")
    wait_until(lambda: (r := admin.get("/readyz")[1]) and r["master"] is not None,
               what="the master named by the slave")
    schema = schemathesis.openapi.from_url(f"{base}/api/v1/openapi.json", config=_config(
        base, max_examples=SLAVE_MAX_EXAMPLES, phases={"stateful": {"enabled": False}},
        checks={"not_a_server_error": {"expected-statuses": ["2xx", "3xx", "4xx", "503"]}}))
    statuses = run_engine(schema)
    for op, counts in statuses.items():
        answered, path = set(counts) - REFUSALS - {400, 404}, op.split()[1]
        if path == "/readyz" or (path.startswith(API) and path not in SLAVE_PATHS):
            assert answered == {503}, f"{op}: {counts}"  # the master's business
        else:
            assert 200 in answered, f"{op}: {counts}"  # health, metrics, the console
    assert set(statuses) == {r.ok().label for r in schema.get_all_operations()}
    assert slave.alive and "Traceback" not in slave.log_path.read_text(errors="replace")
