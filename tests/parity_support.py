"""Helpers for the transport parity suite (tests/test_parity.py).

The same gateway, reached three ways, in front of the same fixture server with the same policy:

* ``wrap``: ``drawbridge wrap --policy DIR --agent tester ... -- <server>`` over stdio; tools keep the
  server's own names;
* ``serve-stdio``: ``drawbridge serve --config FILE --stdio --agent tester``; tools are ``<upstream>.<tool>``;
* ``serve-http``: ``drawbridge serve --config FILE`` over streamable HTTP at /mcp, a bearer token mapped
  to the agent ``tester``; tools are ``<upstream>.<tool>``.

Each is driven by the official mcp SDK client (2025-11-25 era). The stdio transports use ``StdioTap``,
a client transport of our own over the gateway's stdin/stdout, so that the same connection can also
carry bytes the SDK would never send (a line that is not JSON, an oversize line); the answers the SDK
could not route (``id`` null) are kept for the test. Over HTTP such bytes are POSTed with httpx.

A scenario's observations are a ``Step``: the agent's answers (``Answer``), the trace entries it added
(normalised by ``normal_entry``: no prefix, nothing that varies by run), the calls that reached the
server, the questions the client was asked. ``comparable`` is the part that must be equal across
transports; ``assert_same`` says which transports differ, and how.
"""

from __future__ import annotations

import hashlib
import json
import math
import pprint
import re
import subprocess
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from conftest import LEGACY_VERSION, PYTHON, SERVERS, child_env, scaled
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from serve_support import http_client

TIMEOUT = scaled(90.0)
PROCESS_KINDS = ("run_start", "run_end", "mesh.policy_set")
"""Trace entries every process writes (its run, the policy set it starts with), not a scenario's."""
"""The one bound on every wait of this suite (an answer, a gateway starting or ending, an approval
showing up on the control plane). Nothing waits for it to pass, so it is generous: three gateways
start side by side here, and on a loaded 2-core machine a serve took more than 30 s to print its URL."""

TRANSPORTS = ("wrap", "serve-stdio", "serve-http")
AGENT = "tester"
TOKEN = "parity-agent-token-8c2f"
NOTEBOOK = [PYTHON, str(SERVERS / "notebook.py")]
RUGPULL = [PYTHON, str(SERVERS / "rugpull.py")]
MAX_MESSAGE_BYTES = 2048
APPROVAL_TIMEOUT = round(scaled(10))
"""Seconds a person has to answer, the same in every transport. No scenario waits for it to pass."""
POLICY_FILE = "parity.yaml"
POLICY_NAME = "parity"
POLICY = """\
name: parity
agent: tester
rules:
  - tools: ["*read*"]
    action: allow
  - tools: ["*write*"]
    action: deny
  - tools: ["*publish*"]
    action: human_approval
  - tools: ["*crash*"]
    action: allow
  - tools: ["*echo*"]
    action: allow
  - tools: ["*"]
    action: deny
"""
"""One text for every transport: each glob matches the bare name (``wrap``) and the namespaced one
(``serve``) alike, so the same rule index decides a call whichever transport carried it."""
RULE_READ, RULE_WRITE, RULE_PUBLISH, RULE_CRASH, RULE_ECHO, RULE_REST = range(6)

FSIZE_WRAPPER = (
    "import os, resource, sys; limit = int(sys.argv[1]); "
    "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)); os.execv(sys.argv[2], sys.argv[2:])"
)
"""``python -c FSIZE_WRAPPER LIMIT ARGV...``: run ARGV with no file allowed to grow past LIMIT bytes.
Python ignores SIGXFSZ, so a write past the limit fails (EFBIG) instead of killing the process."""


# ------------------------------------------------------------------------------------ the setup


@dataclass
class Upstream:
    """The server behind the gateway: its command, the environment it needs, its id (the serve
    upstream's name, wrap's ``--server-id``)."""

    argv: Sequence[str]
    env: dict[str, str] = field(default_factory=dict)
    server_id: str = "notebook"


def write_policy(directory: Path) -> Path:
    policies = directory / "policies"
    policies.mkdir(parents=True, exist_ok=True)
    (policies / POLICY_FILE).write_text(POLICY, encoding="utf-8")
    return policies


def write_serve_config(directory: Path, upstream: Upstream, *, http: bool, pin_tools: bool = False) -> Path:
    """The drawbridge.yaml (as JSON) for ``serve`` with the parity settings. Without ``http`` it has
    no ``control`` section, so ``serve --stdio`` opens no control plane: no operator channel, as for
    ``wrap`` without ``--control-port``; with it, the control plane listens on a free port of its own."""
    write_policy(directory)
    document: dict[str, Any] = {
        "upstreams": [
            {
                "name": upstream.server_id,
                "transport": "stdio",
                "command": upstream.argv[0],
                "args": list(upstream.argv[1:]),
                "env": dict(upstream.env),
            }
        ],
        "policy_dir": "./policies",
        "evidence_dir": "./evidence",
        "state_path": "./state.db",
        "fsync": "never",
        "limits": {"max_message_bytes": MAX_MESSAGE_BYTES},
        "auth": {"agents": [{"agent": AGENT, "token_sha256": hashlib.sha256(TOKEN.encode()).hexdigest()}]},
        "approval": {"timeout_seconds": APPROVAL_TIMEOUT},
    }
    if pin_tools:
        document["pin_tools"] = True
    if http:
        document["listen"] = {"host": "127.0.0.1", "port": 0}
        document["control"] = {"host": "127.0.0.1", "port": 0}
    path = directory / "drawbridge.yaml"
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return path


def wrap_command(directory: Path, upstream: Upstream, *extra: str) -> list[str]:
    """``drawbridge wrap`` with the parity settings (those of ``write_serve_config``)."""
    policies = write_policy(directory)
    return [
        PYTHON, "-m", "drawbridge", "wrap",
        "--policy", str(policies),
        "--agent", AGENT,
        "--evidence-dir", str(directory / "evidence"),
        "--server-id", upstream.server_id,
        "--fsync", "never",
        "--max-message-bytes", str(MAX_MESSAGE_BYTES),
        "--approval-timeout", str(APPROVAL_TIMEOUT),
        *extra,
        "--", *upstream.argv,
    ]


def limited(argv: Sequence[str], max_file_bytes: int | None) -> list[str]:
    """``argv``, run under RLIMIT_FSIZE when ``max_file_bytes`` is given (``FSIZE_WRAPPER``)."""
    if max_file_bytes is None:
        return list(argv)
    return [PYTHON, "-c", FSIZE_WRAPPER, str(max_file_bytes), *argv]


# --------------------------------------------------------------------------- stdio, with a tap


class StdioTap:
    """An mcp client ``Transport`` over a gateway subprocess's stdin/stdout, plus a tap.

    The SDK's messages go to the process as JSON lines, as ``mcp.client.stdio`` sends them.
    ``send_raw`` writes the test's own bytes on the same pipe (never in the middle of an SDK line).
    A response whose ``id`` is null or a string (the SDK's ids are integers) is kept for ``stray``
    instead of reaching the SDK, which could not route it.
    """

    def __init__(self, argv: Sequence[str], env: dict[str, str], stderr: Path) -> None:
        self.argv = list(argv)
        self.env = env
        self.stderr_path = stderr
        self._process: Any = None
        self._lock = anyio.Lock()
        self._stray_in: MemoryObjectSendStream[dict[str, Any]]
        self._stray_out: MemoryObjectReceiveStream[dict[str, Any]]
        self._stray_in, self._stray_out = anyio.create_memory_object_stream[dict[str, Any]](math.inf)

    async def send_raw(self, data: bytes) -> None:
        assert self._process is not None and self._process.stdin is not None
        async with self._lock:
            await self._process.stdin.send(data)

    async def stray(self) -> dict[str, Any]:
        """The next answer the SDK could not route."""
        with anyio.fail_after(TIMEOUT):
            return await self._stray_out.receive()

    @asynccontextmanager
    async def transport(self) -> AsyncIterator[tuple[Any, Any]]:
        with open(self.stderr_path, "ab") as errlog:
            process = await anyio.open_process(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errlog, env=self.env
            )
        self._process = process
        to_sdk, from_gateway = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        to_gateway, from_sdk = anyio.create_memory_object_stream[SessionMessage](0)

        async def reader() -> None:
            assert process.stdout is not None
            buffer = b""
            async with to_sdk:
                try:
                    while True:
                        buffer += await process.stdout.receive(65536)
                        *lines, buffer = buffer.split(b"\n")
                        for line in lines:
                            await self._deliver(line, to_sdk)
                except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                    pass

        async def writer() -> None:
            async with from_sdk:
                async for message in from_sdk:
                    line = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    try:
                        await self.send_raw(line.encode())
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                        return

        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            tg.start_soon(writer)
            try:
                yield from_gateway, to_gateway
            finally:
                with anyio.CancelScope(shield=True):
                    assert process.stdin is not None
                    async with self._lock:
                        await process.stdin.aclose()  # the agent is gone: the gateway ends
                    with anyio.move_on_after(TIMEOUT):
                        await process.wait()
                    if process.returncode is None:
                        process.kill()
                        await process.wait()
                tg.cancel_scope.cancel()

    async def _deliver(self, line: bytes, to_sdk: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if isinstance(message, dict) and "method" not in message and not isinstance(message.get("id"), int):
            await self._stray_in.send(message)
            return
        try:
            parsed: SessionMessage | Exception = SessionMessage(
                types.jsonrpc_message_adapter.validate_json(line, by_name=False)
            )
        except ValueError as exc:
            parsed = exc
        try:
            await to_sdk.send(parsed)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass


# ---------------------------------------------------------------------------------- HTTP serve

URL_LINE = re.compile(r"serving \d+ upstream\(s\) on (http://\S+/mcp)")


@asynccontextmanager
async def http_serve(argv: Sequence[str], env: dict[str, str], stderr: Path) -> AsyncIterator[str]:
    """Start ``argv`` (a ``serve --config`` command line) and yield the URL it serves once it printed
    it; its stderr is copied to ``stderr``. The waits run in worker threads, so the event loop serves
    the other sessions meanwhile."""
    process = subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    )
    found: list[str] = []
    ready = threading.Event()

    def drain() -> None:
        assert process.stderr is not None
        with open(stderr, "a", encoding="utf-8") as copy:
            for raw in process.stderr:
                line = raw.decode("utf-8", "replace")
                copy.write(line)
                copy.flush()
                match = URL_LINE.search(line)
                if match:
                    found.append(match.group(1))
                    ready.set()
        ready.set()

    def stop() -> None:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        thread.join(TIMEOUT)

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    try:
        await anyio.to_thread.run_sync(ready.wait, TIMEOUT)
        if not found:
            raise AssertionError("the gateway did not start (see its stderr)")
        yield found[0]
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(stop)


# ------------------------------------------------------------------------------ one agent session


@dataclass
class Raw:
    """The answer to bytes the test sent itself: the JSON-RPC message, and the HTTP status if any."""

    message: dict[str, Any]
    status: int | None = None


@dataclass
class Session:
    """One agent's connection through one transport."""

    transport: str
    directory: Path
    client: Client
    send_raw: Callable[[bytes], Any]
    upstream: str
    url: str | None = None

    @property
    def prefix(self) -> str:
        """What this transport puts before the upstream's tool names."""
        return "" if self.transport == "wrap" else f"{self.upstream}."

    def name(self, tool: str) -> str:
        return self.prefix + tool

    @property
    def evidence(self) -> Path:
        return self.directory / "evidence"

    def trace(self) -> list[dict[str, Any]]:
        return read_trace(self.evidence)


def read_trace(evidence: Path) -> list[dict[str, Any]]:
    """The entries of the trace; a last line still being written (no newline yet) is left out."""
    path = evidence / "trace.ndjson"
    if not path.exists():
        return []
    *lines, _partial = path.read_bytes().split(b"\n")
    return [json.loads(line) for line in lines]


def gateway_stderr(directory: Path) -> str:
    path = directory / "gateway.stderr"
    return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


@asynccontextmanager
async def session(
    transport: str,
    directory: Path,
    upstream: Upstream,
    *,
    limiter: anyio.CapacityLimiter,
    wrap_extra: Sequence[str] = (),
    pin_tools: bool = False,
    max_file_bytes: int | None = None,
    **client_options: Any,
) -> AsyncIterator[Session]:
    """A gateway of ``transport`` in ``directory`` (evidence in ``directory/evidence``, stderr in
    ``directory/gateway.stderr``) in front of ``upstream``, and an mcp SDK client connected to it as
    the agent ``tester``. The session holds a token of ``limiter`` while it lasts, so that concurrent
    sessions do not all start at once."""
    directory.mkdir(parents=True, exist_ok=True)
    # wrap passes its environment on to the server; serve gives each upstream the config's ``env``.
    env = child_env(upstream.env) if transport == "wrap" else child_env()
    client_options.setdefault("cache", None)
    stderr = directory / "gateway.stderr"
    async with limiter:
        if transport == "serve-http":
            config = write_serve_config(directory, upstream, http=True, pin_tools=pin_tools)
            argv = limited([PYTHON, "-m", "drawbridge", "serve", "--config", str(config)], max_file_bytes)
            async with http_serve(argv, env, stderr) as url:
                raw_session: dict[str, str] = {}

                async def post_raw(data: bytes) -> Raw:
                    return await _post_raw(url, raw_session, data)

                async with http_client(url, "legacy", TOKEN, **client_options) as client:
                    yield Session(transport, directory, client, post_raw, upstream.server_id, url)
            return
        if transport == "serve-stdio":
            config = write_serve_config(directory, upstream, http=False, pin_tools=pin_tools)
            argv = [PYTHON, "-m", "drawbridge", "serve", "--config", str(config), "--stdio", "--agent", AGENT]
        elif transport == "wrap":
            argv = wrap_command(directory, upstream, *wrap_extra)
        else:
            raise ValueError(transport)
        tap = StdioTap(limited(argv, max_file_bytes), env, stderr)

        async def inject(data: bytes) -> Raw:
            await tap.send_raw(data)
            return Raw(await tap.stray())

        async with Client(tap.transport(), mode="legacy", **client_options) as client:
            yield Session(transport, directory, client, inject, upstream.server_id)


JSON_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


async def _post_raw(url: str, raw_session: dict[str, str], data: bytes) -> Raw:
    """POST ``data`` as the agent, on an HTTP session of its own (initialized on first use)."""
    auth = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(timeout=TIMEOUT, trust_env=False) as http:
        if "id" not in raw_session:
            client = {"name": "raw", "version": "0"}
            params = {"protocolVersion": LEGACY_VERSION, "capabilities": {}, "clientInfo": client}
            init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}
            response = await http.post(url, json=init, headers={**JSON_HEADERS, **auth})
            assert response.status_code == 200, response.text
            raw_session["id"] = response.headers["mcp-session-id"]
        headers = {**JSON_HEADERS, **auth, "mcp-session-id": raw_session["id"]}
        response = await http.post(url, content=data, headers=headers)
    return Raw(response.json(), response.status_code)


# ---------------------------------------------------------------------------------- normalising

SHORT_ID = re.compile(r"\bapproval [0-9a-f]{8}\b")


def normal_text(text: str | None, prefix: str) -> str | None:
    """``text`` without the transport's tool prefix and with approval ids (which vary by run) blanked."""
    if text is None:
        return None
    if prefix:
        text = text.replace(prefix, "")
    return SHORT_ID.sub("approval <id>", text)


def _strip(value: Any, prefix: str) -> Any:
    return value.removeprefix(prefix) if isinstance(value, str) and prefix else value


APPROVAL_KEYS = ("settled", "how", "resolved_by", "channel", "strength")


def normal_entry(entry: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """A trace entry without what varies by run or by transport: timestamps, latencies, digests,
    fingerprints, request and approval ids, hashes, the tool prefix."""
    kind = entry["kind"]
    body = entry["body"]
    if kind == "tool_decision":
        normal = {
            "kind": kind,
            "tool": _strip(body.get("tool"), prefix),
            "action": body.get("action"),
            "outcome": body.get("outcome"),
            "error_code": body.get("error_code"),
            "policy": body.get("policy"),
            "rule_index": body.get("rule_index"),
            "source_file": body.get("source_file"),
            "agent": body.get("agent"),
            "reason": normal_text(body.get("reason"), prefix),
        }
        approval = body.get("approval")
        if isinstance(approval, Mapping):
            normal["approval"] = {key: normal_text(approval.get(key), prefix) for key in APPROVAL_KEYS}
        return normal
    if kind == "relay_incident":
        return incident(body.get("kind"), body.get("direction"), body.get("code"))
    if kind in ("approval_requested", "approval_resolved"):
        return {
            "kind": kind,
            "tool": _strip(body.get("tool"), prefix),
            "agent": body.get("agent"),
            "status": body.get("status"),
            "channel": body.get("channel"),
            "strength": body.get("strength"),
            "resolved_by": body.get("resolved_by"),
        }
    if kind == "mesh.pin_held_back":
        fields = ("tool", "status", "floor", "pinned_description", "description")
        rows = [tuple(t.get(name) for name in fields) for t in body.get("tools", [])]
        return {"kind": kind, "server": body.get("server"), "cause": body.get("cause"), "tools": sorted(rows),
                "removed": body.get("removed")}
    if kind == "mesh.pin_first_use":
        return {"kind": kind, "server": body.get("server"), "cause": body.get("cause"),
                "tools": sorted(t.get("tool") for t in body.get("tools", []))}
    return {"kind": kind}


def decision_key(entry: Mapping[str, Any]) -> tuple[Any, ...]:
    """The (kind, tool, action, outcome, error_code, policy, rule_index) of a normalised entry."""
    return tuple(entry.get(key) for key in DECISION_KEY)


DECISION_KEY = ("kind", "tool", "action", "outcome", "error_code", "policy", "rule_index")


def decision(
    tool: str, action: str | None, outcome: str, policy: str | None, rule: int | None, code: int | None = None
) -> tuple[Any, ...]:
    """The ``decision_key`` a tool_decision entry is expected to have."""
    return ("tool_decision", tool, action, outcome, code, policy, rule)


def incident(kind: str, direction: str, code: int | None) -> dict[str, Any]:
    """A normalised relay_incident entry."""
    return {"kind": "relay_incident", "incident": kind, "direction": direction, "code": code}


def server_calls(log: Path | None) -> list[str]:
    """The tool names the fixture server received, in order (``NOTEBOOK_LOG``)."""
    return log.read_text(encoding="utf-8").splitlines() if log is not None and log.exists() else []


# -------------------------------------------------------------------------------- observations


@dataclass
class Answer:
    """What the agent saw for one request (the transport's prefix and approval ids taken out)."""

    is_error: bool | None = None
    text: str | None = None
    decision: dict[str, Any] | None = None
    """``_meta["drawbridge/decision"]`` of a refusal."""
    error_code: int | None = None
    error_message: str | None = None
    structured: Any = None


def answer_of(result: types.CallToolResult, prefix: str) -> Answer:
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    decision = (result.meta or {}).get("drawbridge/decision")
    return Answer(
        is_error=bool(result.is_error),
        text=normal_text("\n".join(texts), prefix),
        decision=dict(decision) if isinstance(decision, Mapping) else None,
        structured=result.structured_content,
    )


def raw_answer(raw: Raw, prefix: str) -> Answer:
    error = raw.message.get("error")
    if isinstance(error, dict):
        return Answer(error_code=error.get("code"), error_message=normal_text(error.get("message"), prefix))
    result = raw.message.get("result") or {}
    texts = [block.get("text", "") for block in result.get("content", []) if isinstance(block, dict)]
    return Answer(is_error=bool(result.get("isError")), text=normal_text("\n".join(texts), prefix))


@dataclass
class Step:
    """What one scenario showed: the agent's answers, the trace entries it added, the calls that
    reached the server, the questions the client was asked."""

    name: str
    answers: list[Answer] = field(default_factory=list)
    statuses: list[int | None] = field(default_factory=list)
    """The HTTP status of each answer to bytes the test sent itself (None on stdio)."""
    entries: list[dict[str, Any]] = field(default_factory=list)
    server: list[str] = field(default_factory=list)
    questions: list[str] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    notes: dict[str, Any] = field(default_factory=dict)
    """Whatever else the scenario's own test looks at (not compared across transports)."""
    failure: str | None = None
    marks: tuple[int, int, int] = (0, 0, 0)
    """Where the trace, the server log and the questions stood when the step began."""

    def describe(self) -> str:
        shown: dict[str, Any] = {
            "answers": [answer.__dict__ for answer in self.answers],
            "statuses": self.statuses,
            "trace": self.entries,
            "reached the server": self.server,
            "questions asked": len(self.questions),
        }
        if self.failure:
            shown["failure"] = self.failure
        return pprint.pformat(shown, width=140, sort_dicts=False)


@dataclass
class Run:
    """One transport's observations by scenario; ``failure`` when the session itself broke."""

    transport: str
    steps: dict[str, Step] = field(default_factory=dict)
    failure: str | None = None


class Recorder:
    """Cuts one session's trace, server log and questions into steps."""

    def __init__(
        self, s: Session, run: Run, log: Path | None = None, questions: list[str] | None = None
    ) -> None:
        self.s, self.run, self.log = s, run, log
        self.questions = questions if questions is not None else []

    def begin(self, name: str, *, trace_from: int | None = None) -> Step:
        """A new step; its trace entries are those after ``trace_from`` (default: the current end)."""
        trace = len(self.s.trace()) if trace_from is None else trace_from
        step = Step(name, marks=(trace, len(server_calls(self.log)), len(self.questions)))
        self.run.steps[name] = step
        return step

    def finish(self, step: Step) -> None:
        """Take what was added since ``begin`` (may be called again, after the gateway ended)."""
        trace, server, asked = step.marks
        step.entries = [normal_entry(entry, self.s.prefix) for entry in self.s.trace()[trace:]
                        if entry["kind"] not in PROCESS_KINDS]
        step.server = server_calls(self.log)[server:]
        step.questions = self.questions[asked:]

    @asynccontextmanager
    async def step(self, name: str) -> AsyncIterator[Step]:
        """``begin`` .. ``finish``; an exception inside is the step's failure, and later steps still run."""
        step = self.begin(name)
        try:
            yield step
        except Exception as exc:  # noqa: BLE001
            step.failure = describe_failure(exc)
        self.finish(step)

    async def call(self, step: Step, tool: str, arguments: dict[str, Any]) -> Answer:
        """``tools/call`` of ``tool`` (the bare name; the transport's prefix is added) through the SDK."""
        s = self.s
        try:
            with anyio.fail_after(TIMEOUT):
                result = await s.client.call_tool(s.name(tool), arguments)
        except MCPError as exc:
            answer = Answer(error_code=exc.error.code, error_message=normal_text(exc.error.message, s.prefix))
        else:
            answer = answer_of(result, s.prefix)
        step.answers.append(answer)
        return answer

    async def raw(self, step: Step, data: bytes) -> Answer:
        """Bytes of the test's own, on the agent's connection (stdio) or POSTed as the agent (HTTP)."""
        raw: Raw = await self.s.send_raw(data)
        answer = raw_answer(raw, self.s.prefix)
        step.answers.append(answer)
        step.statuses.append(raw.status)
        return answer


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def describe_failure(exc: BaseException, directory: Path | None = None) -> str:
    """An exception (the leaves of a group), and with ``directory`` the end of the gateway's stderr."""
    said = "; ".join(f"{type(leaf).__name__}: {leaf}" for leaf in _leaves(exc))
    if directory is None:
        return said
    return f"{said}\n--- gateway stderr ---\n{gateway_stderr(directory)[-3000:] or '(empty)'}"


# ------------------------------------------------------------------------------------ checking


def comparable(step: Step) -> dict[str, Any]:
    """What must be equal across transports: the answers (isError, text, the refusal's decision, the
    JSON-RPC error code, the structured content), the normalised trace entries, the calls that
    reached the server, how many questions the client was asked, the listed tools."""
    return {
        "answers": [(a.is_error, a.text, a.decision, a.error_code, a.structured) for a in step.answers],
        "trace": step.entries,
        "server": step.server,
        "questions": len(step.questions),
        "tools": step.tools,
    }


def assert_same(values: Mapping[str, Any], what: str) -> None:
    """Every transport shows the same value; else say which transports differ, and how."""
    groups: list[tuple[Any, list[str]]] = []
    for transport, value in values.items():
        for known, members in groups:
            if known == value:
                members.append(transport)
                break
        else:
            groups.append((value, [transport]))
    if len(groups) > 1:
        shown = "\n".join(
            f"--- {', '.join(members)}:\n{pprint.pformat(value, width=140, sort_dicts=False)}"
            for value, members in groups
        )
        raise AssertionError(f"{what} differs between transports:\n{shown}")
