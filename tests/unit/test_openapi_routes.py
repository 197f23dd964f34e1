"""docs/openapi.yaml describes exactly the routes the management listener registers: a
route added without its description (or a description left behind by a removed route)
fails here, naming it. Also: the package data the node serves is that same file."""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path

import pytest
import yaml
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

from amqlite.management.app import ManagementServer
from amqlite.management.document import RESOURCE, DocumentMissing, OpenApiDocument
from amqlite.management.httplog import MalformedRequestFilter, server_logger

DOCS = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"
METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
STATIC_PATH = "/static/{filename}"


def _app() -> web.Application:
    """The listener's app as the node builds it; the route table needs no node (the
    handlers are only bound, never called), so ``__init__`` is skipped."""
    server = object.__new__(ManagementServer)
    return server._make_app()


def registered() -> set[tuple[str, str]]:
    """(method, path template) of every route; HEAD comes with each GET (aiohttp's
    ``allow_head``) and is not described separately."""
    routes: set[tuple[str, str]] = set()
    for route in _app().router.routes():
        assert route.resource is not None
        routes.add((route.method.lower(), route.resource.canonical))
    return {(m, p) for m, p in routes if not (m == "head" and ("get", p) in routes)}


def documented() -> set[tuple[str, str]]:
    doc = yaml.safe_load(DOCS.read_text(encoding="utf-8"))
    return {(m, path) for path, item in doc["paths"].items() for m in item if m in METHODS}


def test_every_registered_route_is_documented() -> None:
    missing = sorted(registered() - documented())
    assert not missing, f"routes missing from docs/openapi.yaml: {missing}"


def test_every_documented_route_is_registered() -> None:
    extra = sorted(documented() - registered())
    assert not extra, f"docs/openapi.yaml describes routes the node does not have: {extra}"


def test_the_route_table_is_what_the_comparison_sees() -> None:
    """The comparison would pass on two empty sets: the known routes are in it."""
    routes = registered()
    for route in [("get", "/healthz"), ("get", "/api/v1/openapi.json"),
                  ("post", "/api/v1/move/{kind}/{name}"), ("get", STATIC_PATH),
                  ("delete", "/api/v1/subscriptions/{client_id}/{name}")]:
        assert route in routes
    assert not any(m == "head" for m, _ in routes)


def test_path_parameters_match_the_templates() -> None:
    """Each operation declares exactly the parameters its path template names."""
    doc = yaml.safe_load(DOCS.read_text(encoding="utf-8"))

    def resolve(p: dict) -> dict:
        ref = p.get("$ref")
        return doc["components"]["parameters"][ref.rsplit("/", 1)[1]] if ref else p

    for path, item in doc["paths"].items():
        names = {seg[1:-1] for seg in path.split("/") if seg.startswith("{")}
        shared = [resolve(p) for p in item.get("parameters", [])]
        for method in (m for m in item if m in METHODS):
            params = shared + [resolve(p) for p in item[method].get("parameters", [])]
            declared = {p["name"] for p in params if p["in"] == "path"}
            assert declared == names, f"{method.upper()} {path}: {declared} != {names}"
            assert all(p.get("required") for p in params if p["in"] == "path")


def test_the_node_serves_the_docs_file() -> None:
    """The package data is docs/openapi.yaml (a link to it, or a built copy of it)."""
    installed = resources.files("amqlite.management").joinpath(RESOURCE).read_bytes()
    assert installed == DOCS.read_bytes()
    document = OpenApiDocument()
    assert document.as_yaml() == installed
    assert yaml.safe_load(document.as_json()) == yaml.safe_load(installed)


def test_a_missing_document_is_one_line_not_a_raw_error() -> None:
    """A broken install answers 404 with this line (app.openapi_json), not a 500."""
    with pytest.raises(DocumentMissing, match="not installed"):
        OpenApiDocument(resource="no-such-file.yaml").as_json()


def test_a_malformed_request_is_one_debug_line_not_a_traceback() -> None:
    """aiohttp logs a request its parser refused at ERROR with a traceback; the
    listener's logger makes it one line at DEBUG (the client already got its 400)."""
    logger = server_logger()
    try:
        raise BadHttpMessage("Invalid header value char:\n\n  b'X: \\x00'\n     ^")
    except BadHttpMessage as e:
        record = logger.makeRecord(logger.name, logging.ERROR, __file__, 1,
                                   "Error handling request from %s", ("127.0.0.1",),
                                   (type(e), e, e.__traceback__))
    shown = MalformedRequestFilter().filter(record)
    assert not shown  # DEBUG is off for it by default
    assert record.levelno == logging.DEBUG and record.exc_info is None
    assert record.getMessage() == ("Error handling request from 127.0.0.1: "
                                   "Invalid header value char:")
    other = logger.makeRecord(logger.name, logging.ERROR, __file__, 1, "other", (), None)
    assert MalformedRequestFilter().filter(other) and other.levelno == logging.ERROR
