"""The real HTTP backend of the OpenAPI upstream tests (``fixtures/openapi_backend.py``) and its spec."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from conftest import FIXTURES, PYTHON
from serve_support import background, free_port, wait_for_port

SPEC = FIXTURES / "openapi" / "items.yaml"
BACKEND = FIXTURES / "openapi_backend.py"


@dataclass
class Backend:
    port: int

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def spec_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/openapi.yaml"

    def log(self) -> list[dict[str, Any]]:
        """Every request that reached the API, in order."""
        with httpx.Client(trust_env=False) as client:
            return list(json.loads(client.get(f"http://127.0.0.1:{self.port}/_log").text))


@contextmanager
def openapi_backend() -> Iterator[Backend]:
    port = free_port()
    with background([PYTHON, str(BACKEND), str(port)]):
        wait_for_port(port)
        yield Backend(port)


def items_entry(backend: Backend, **more: Any) -> dict[str, Any]:
    """The ``openapi:`` entry for the backend's spec, read from the committed file."""
    entry: dict[str, Any] = {"name": "items", "file": str(SPEC), "backend_url": backend.api, "allow_private": True}
    entry.update(more)
    return entry
