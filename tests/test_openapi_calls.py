"""One OpenAPI call from request to result, behind ``drawbridge serve``: the real HTTP backend of
``openapi_support`` answering ``fixtures/openapi/answers.yaml``. What an agent may put in the request
(never a header the gateway owns), how long a call may take (one deadline, not a gap between reads),
and answers that must still end as a result recorded as what the agent got (JSON too deep or not a
double)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from approval_support import decisions, text_of
from conftest import FIXTURES, scaled
from openapi_support import Backend, openapi_backend
from serve_support import http_client, http_gateway, write_config

pytestmark = pytest.mark.anyio

ANSWERS = FIXTURES / "openapi" / "answers.yaml"
ALLOW_ALL = {"p.yaml": "name: p\nagent: '*'\nrules:\n  - tools: ['answers.*']\n    action: allow\n"}
SECRET = "gateway-secret-7c1"
KEY = {"ANSWERS_KEY": SECRET}


@pytest.fixture(scope="module")
def backend() -> Iterator[Backend]:
    with openapi_backend() as running:
        yield running


def _config(tmp_path: Path, backend: Backend, **more: Any) -> Path:
    entry: dict[str, Any] = {"name": "answers", "file": str(ANSWERS), "backend_url": backend.api,
                             "allow_private": True, "headers": {"X-Api-Key": "ANSWERS_KEY"}}
    entry.update(more)
    return write_config(
        tmp_path, [], policies=ALLOW_ALL, openapi=[entry], evidence_dir=str(tmp_path / "evidence"),
        state_path=str(tmp_path / "state.db"), auth={"anonymous_agent": "guest"},
    )


def _outcomes(tmp_path: Path, tool: str) -> list[str]:
    return [d["outcome"] for d in decisions(tmp_path / "evidence", tool)]


async def test_an_agent_sets_no_header_the_gateway_owns(tmp_path: Path, backend: Backend) -> None:
    with http_gateway(_config(tmp_path, backend), env=KEY) as gateway:
        assert gateway.url is not None
        async with http_client(gateway.url) as client:
            tool = {t.name: t for t in (await client.list_tools()).tools}["answers.get_headers"]
            # The configured credential (in any case) and the transport's headers are no arguments.
            assert set(tool.input_schema["properties"]) == {"X-Trace"}
            start = len(backend.log())
            replaced = await client.call_tool("answers.get_headers", {"x-api-key": "agent-key", "Host": "admin.example"})
            assert replaced.is_error and "input schema" in text_of(replaced)
            assert len(backend.log()) == start  # not sent

            sent = await client.call_tool("answers.get_headers", {"X-Trace": "t-1"})
    assert not sent.is_error
    received = sent.structured_content
    assert received is not None
    assert received["x-api-key"] == SECRET and received["x-trace"] == "t-1"
    assert received["host"] == f"127.0.0.1:{backend.port}"
    assert SECRET not in gateway.text()


async def test_a_cookie_the_backend_sets_is_not_kept(tmp_path: Path, backend: Backend) -> None:
    with http_gateway(_config(tmp_path, backend), env=KEY) as gateway:
        assert gateway.url is not None
        async with http_client(gateway.url) as client:
            assert not (await client.call_tool("answers.get_cookie", {})).is_error
            again = await client.call_tool("answers.get_headers", {})  # the next call may be another agent's
    assert again.structured_content is not None and "cookie" not in again.structured_content


async def test_a_header_value_http_cannot_carry_is_not_sent(tmp_path: Path, backend: Backend) -> None:
    with http_gateway(_config(tmp_path, backend), env=KEY) as gateway:
        assert gateway.url is not None
        async with http_client(gateway.url) as client:
            start = len(backend.log())
            tab = await client.call_tool("answers.get_headers", {"X-Trace": "a\u000bsecretvalue"})
            assert len(backend.log()) == start
    # Refused before sending, naming the parameter, never the value.
    assert tab.is_error and text_of(tab).startswith("the call was not sent: header parameter X-Trace")
    assert "secretvalue" not in text_of(tab) and "secretvalue" not in gateway.text()


async def test_the_timeout_bounds_the_whole_call(tmp_path: Path, backend: Backend) -> None:
    with http_gateway(_config(tmp_path, backend, timeout="1s"), env=KEY) as gateway:
        assert gateway.url is not None
        async with http_client(gateway.url) as client:
            began = time.monotonic()
            slow = await client.call_tool("answers.get_trickle", {})
            took = time.monotonic() - began
    # The backend never pauses 1 s between bytes, but takes 30 s in all: cut at 1 s.
    assert slow.is_error and "did not answer in full within 1 seconds" in text_of(slow)
    assert took < scaled(15)
    assert _outcomes(tmp_path, "answers.get_trickle") == ["tool_error"]


@pytest.mark.parametrize(("tool", "why"), [
    ("answers.get_deep", "nests deeper than 64 levels"),
    ("answers.get_nan", "NaN and Infinity are not JSON"),
])
async def test_json_no_one_reads_alike_is_text_and_recorded_as_such(
    tmp_path: Path, backend: Backend, tool: str, why: str
) -> None:
    with http_gateway(_config(tmp_path, backend), env=KEY) as gateway:
        assert gateway.url is not None
        async with http_client(gateway.url) as client:
            answered: types.CallToolResult = await client.call_tool(tool, {})
    assert not answered.is_error and answered.structured_content is None
    note = text_of(answered).rpartition("\n")[2]
    assert note.startswith("[drawbridge: the answer is not read as JSON (") and why in note
    assert _outcomes(tmp_path, tool) == ["ok"]  # what the agent got: a result, and the call ran
    assert "upstream_exited" not in gateway.text() and "ERROR" not in gateway.text()


async def test_text_is_decoded_by_the_charset_the_backend_declares(tmp_path: Path, backend: Backend) -> None:
    with http_gateway(_config(tmp_path, backend), env=KEY) as gateway:
        assert gateway.url is not None
        async with http_client(gateway.url) as client:
            answered = await client.call_tool("answers.get_latin1", {})
    assert not answered.is_error and text_of(answered) == "caf\u00e9"


async def test_the_patterns_of_one_call_share_one_regex_budget(tmp_path: Path, backend: Backend) -> None:
    """Each word costs its length squared to check against ``[a-z]+`` (unanchored): one 4,000-character
    word is within the call's budget, five are not, and the call is refused before anything is sent
    rather than holding the event loop for as long as the checks would take."""
    with http_gateway(_config(tmp_path, backend), env=KEY) as gateway:
        assert gateway.url is not None
        async with http_client(gateway.url) as client:
            one = await client.call_tool("answers.get_words", {"w": ["a" * 4000]})
            start = len(backend.log())
            five = await client.call_tool("answers.get_words", {"w": ["b" * 4000] * 5})
            sent = len(backend.log()) - start
    assert not one.is_error, text_of(one)
    assert five.is_error and sent == 0
    assert "the call's strings are too long, together, for the schema's patterns to be checked" in text_of(five)
    assert text_of(five).startswith("the arguments do not match the tool's input schema:")
