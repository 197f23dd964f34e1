"""The API's OpenAPI document, served by the node from package data (no network).

``docs/openapi.yaml`` is the one copy; ``amqlite/management/openapi.yaml`` links to it
and is installed with the package (the Docker image copies the docs file in before it
installs). The node serves the file as it is at ``/api/v1/openapi.yaml`` and as JSON at
``/api/v1/openapi.json``, read and parsed once, on the first request for it.
"""

from __future__ import annotations

import json
import threading
from importlib import resources

import yaml

#: Package data file (a link to docs/openapi.yaml in a source tree).
RESOURCE = "openapi.yaml"
#: RFC 9512's media type for YAML.
YAML_TYPE = "application/yaml"
#: libyaml's safe loader when PyYAML was built with it (~10x faster), else the Python one.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class DocumentMissing(Exception):
    """The document is not installed or cannot be read (a broken install: 404)."""


class OpenApiDocument:
    """The document as YAML bytes and as JSON text, loaded once."""

    def __init__(self, package: str = __package__ or "amqlite.management",
                 resource: str = RESOURCE) -> None:
        self.package, self.resource = package, resource
        self._lock = threading.Lock()
        self._yaml: bytes | None = None
        self._json: str | None = None

    def _load(self) -> tuple[bytes, str]:
        with self._lock:
            if self._yaml is None or self._json is None:
                try:
                    raw = resources.files(self.package).joinpath(self.resource).read_bytes()
                    parsed = yaml.load(raw, Loader=_LOADER)
                except (OSError, yaml.YAMLError) as e:
                    raise DocumentMissing(f"the OpenAPI document is not installed or "
                                          f"unreadable ({type(e).__name__})") from None
                if not isinstance(parsed, dict):
                    raise DocumentMissing("the installed OpenAPI document is not a mapping")
                self._yaml, self._json = raw, json.dumps(parsed)
            return self._yaml, self._json

    def as_yaml(self) -> bytes:
        return self._load()[0]

    def as_json(self) -> str:
        return self._load()[1]
