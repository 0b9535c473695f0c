"""Approval notifications (``approval.notify``): a pending approval is posted to the operator's webhooks.

A real ``drawbridge serve`` with a GitHub-like upstream and a ``human_approval`` rule, an mcp SDK client,
the control plane, and a real HTTP receiver on a loopback port that records each POST and answers as
each path says (200, 500, a redirect, or holding the request open). Each webhook URL carries a
distinctive token in its path: it must never reach the gateway's log, nor an argument value a body.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import subprocess
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest
from approval_support import pending_on, answered_by_operator, text_of, trace, wait_pending_on, wrap_flags
from conftest import PYTHON, SERVERS, child_env, connect, scaled, wrap_params
from serve_support import GITHUB, Running, fields_of, http_client, http_gateway, serve_argv, write_config

from mcp import types

from drawbridge.approval.notices import PendingNotice, json_body, notice_bytes, slack_body
from drawbridge.config import ConfigError, parse_config
from drawbridge.config_notify import NotifyTarget
from drawbridge.gateway.pipeline.approvals.notify import ApprovalNotifier
from drawbridge.state.approvals import Approval, ApprovalStatus

pytestmark = pytest.mark.anyio

POLICIES = {
    "p.yaml": "name: p\nagent: '*'\nrules:\n  - tools: ['github.delete_repo', 'github.add_deploy_key']\n"
    "    action: human_approval\n"
}
ARGUMENT = "argument-value-never-posted-4e1d"
KEY = {"owner": "acme", "repo": "anvil", "title": "deploy", "key": f"ssh-ed25519 {ARGUMENT}"}
TOKEN = "hooksecret"
"""In every webhook URL's path: it must appear in no line the gateway writes."""
CONSOLE = "https://console.example.test"
WAIT = scaled(30.0)
BIG = 64 << 20
"""The body of the ``big`` receiver's answer: far more than a status needs."""


class Hook:
    """A webhook receiver on a loopback port: records each POST as (path, body) and answers by the
    path's first segment: ``ok`` 200, ``fail`` 500, ``moved`` a 302 to ``/followed``, ``hang`` holds the
    request until ``release`` is set, ``big`` a 200 whose body of ``BIG`` bytes is made as it is sent
    (``big_sent`` counts what the client took before it closed; ``big_done`` is set at the end)."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, bytes]] = []
        self.changed = threading.Condition()
        self.release = threading.Event()
        self.big_sent = 0
        self.big_done = threading.Event()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 -- http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with hook.changed:
                    hook.posts.append((self.path, body))
                    hook.changed.notify_all()
                kind = self.path.split("/")[1]
                if kind == "hang":
                    hook.release.wait(WAIT)
                if kind == "big":
                    self._big()
                    return
                status = {"fail": 500, "moved": 302}.get(kind, 200)
                self.send_response(status)
                if status == 302:
                    self.send_header("Location", f"http://127.0.0.1:{hook.port}/followed/{TOKEN}")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _big(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(BIG))
                self.end_headers()
                chunk = b"x" * (1 << 20)
                try:
                    while hook.big_sent < BIG:
                        self.wfile.write(chunk)
                        hook.big_sent += len(chunk)
                except OSError:
                    self.close_connection = True
                finally:
                    hook.big_done.set()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, kind: str) -> str:
        return f"http://127.0.0.1:{self.port}/{kind}/{TOKEN}-{kind}"

    def to(self, kind: str) -> list[bytes]:
        with self.changed:
            return [body for path, body in self.posts if path.split("/")[1] == kind]

    def wait(self, holds: Callable[[], bool]) -> None:
        with self.changed:
            assert self.changed.wait_for(holds, WAIT), self.posts

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook() -> Iterator[Hook]:
    receiver = Hook()
    try:
        yield receiver
    finally:
        receiver.close()


def _config(tmp_path: Path, notify: list[dict[str, Any]], **approval: Any) -> Path:
    return write_config(
        tmp_path, [GITHUB], policies=POLICIES, approval={"timeout_seconds": 60, "notify": notify, **approval},
        evidence_dir=str(tmp_path / "evidence"), state_path=str(tmp_path / "state.db"),
        auth={"anonymous_agent": "guest"},
    )


def _clean_log(gateway: Running) -> str:
    text = gateway.text()
    assert TOKEN not in text and ARGUMENT not in text, text
    return text


async def test_a_pending_approval_is_posted_once_to_each_target_without_holding_up_its_answer(
    tmp_path: Path, hook: Hook
) -> None:
    targets = [
        {"url_env": "GW_HOOK_OK", "console_url": CONSOLE},
        {"url_env": "GW_HOOK_SLACK", "format": "slack"},
        {"url_env": "GW_HOOK_FAIL"},
        {"url_env": "GW_HOOK_MOVED"},
        {"url_env": "GW_HOOK_HANG", "timeout_seconds": 60},
    ]
    env = {f"GW_HOOK_{kind.upper()}": hook.url(kind) for kind in ("ok", "slack", "fail", "moved", "hang")}
    env["GW_HOOK_SLACK"] = hook.url("ok").replace("/ok/", "/slack/")
    with http_gateway(_config(tmp_path, targets), env) as gateway:
        assert gateway.url is not None
        async with http_client(gateway.url) as client, httpx.AsyncClient(
            base_url=gateway.control(), trust_env=False, headers=gateway.control_headers()
        ) as http:
            async def held_open() -> None:  # the hanging receiver holds its POST open while the operator approves
                await anyio.to_thread.run_sync(hook.wait, lambda: len(hook.to("hang")) == 1)

            done = await answered_by_operator(client, http, "github.add_deploy_key", KEY, "approve", before=held_open)
            assert not done.is_error and "added" in text_of(done)
            assert not hook.release.is_set()  # answered while the webhook still hangs
        assert await anyio.to_thread.run_sync(
            lambda: gateway.wait_until(lambda text: len(fields_of(text, "approval_notify_failed")) == 2, WAIT)
        )
        failed = {line["target"]: line for line in fields_of(gateway.text(), "approval_notify_failed")}
        log = _clean_log(gateway)
    (requested,) = [entry["body"] for entry in trace(tmp_path / "evidence", "approval_requested")]
    approval_id = requested["approval_id"]
    (posted,) = hook.to("ok")
    assert json.loads(posted) == {
        "event": "approval_pending", "approval_id": approval_id, "agent": "guest", "tool": "github.add_deploy_key",
        "rule": "p #0 (p.yaml)", "reason": requested["reason"],
        "expires_at": requested["expires_at"], "console": f"{CONSOLE}/console/approvals/{approval_id}",
    }
    (slack,) = hook.to("slack")
    text = json.loads(slack)["text"]
    assert approval_id[:8] in text and "guest" in text and "github.add_deploy_key" in text and "console" not in text
    assert len(hook.to("fail")) == 3 and failed["GW_HOOK_FAIL"]["problem"] == "status 500"
    assert failed["GW_HOOK_FAIL"]["attempts"] == "3" and failed["GW_HOOK_FAIL"]["approval_id"] == approval_id
    assert len(hook.to("moved")) == 1 and hook.to("followed") == []
    assert failed["GW_HOOK_MOVED"]["problem"].startswith("status 302") and failed["GW_HOOK_MOVED"]["attempts"] == "1"
    for _path, body in hook.posts:
        assert ARGUMENT.encode() not in body and b"acme" not in body
    assert "WARNING approval_notify_failed" in log


async def test_a_non_blocking_approval_is_posted_once_however_often_its_call_is_retried(
    tmp_path: Path, hook: Hook
) -> None:
    config = _config(tmp_path, [{"url_env": "GW_HOOK_OK"}], non_blocking=True)
    with http_gateway(config, {"GW_HOOK_OK": hook.url("ok")}) as gateway:
        assert gateway.url is not None
        async with http_client(gateway.url) as client, httpx.AsyncClient(
            base_url=gateway.control(), trust_env=False, headers=gateway.control_headers()
        ) as http:
            first = await client.call_tool("github.add_deploy_key", KEY)
            assert first.is_error
            again = await client.call_tool("github.add_deploy_key", KEY)
            assert again.is_error
            (pending,) = await wait_pending_on(http)
            approve = await http.post(f"/approvals/{pending['id']}/approve", json={"resolved_by": "op-ann"})
            assert approve.status_code == 200
            done = await client.call_tool("github.add_deploy_key", KEY)
            assert not done.is_error and "added" in text_of(done)
            # A second question: its POST comes after any the retries could have caused (one queue).
            assert (await client.call_tool("github.delete_repo", {"owner": "acme", "name": "rocket"})).is_error
            await anyio.to_thread.run_sync(hook.wait, lambda: len(hook.to("ok")) >= 2)
        _clean_log(gateway)
    bodies = [json.loads(body) for body in hook.to("ok")]
    assert [body["approval_id"] for body in bodies][0] == pending["id"]
    assert [body["tool"] for body in bodies] == ["github.add_deploy_key", "github.delete_repo"]
    assert "console" not in bodies[0]


class Asked:
    """An elicitation callback that notes which approval each call is asked about (its short id) and
    holds the answer until ``release[short_id]`` is set, then cancels (the operator answered)."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.release: dict[str, anyio.Event] = {}
        self._changed = anyio.Event()

    async def __call__(self, context: Any, params: Any) -> types.ElicitResult:
        match = re.search(r"\(approval ([0-9a-f]+),", params.message)
        assert match is not None, params.message
        self.ids.append(match[1])
        self._changed.set()
        self._changed = anyio.Event()
        await self.release.setdefault(match[1], anyio.Event()).wait()
        return types.ElicitResult(action="cancel")

    async def until(self, count: int) -> list[str]:
        with anyio.fail_after(WAIT):
            while len(self.ids) < count:
                await self._changed.wait()
        return self.ids


async def test_identical_calls_arriving_together_share_one_question_and_one_notice(
    tmp_path: Path, hook: Hook
) -> None:
    calls = 4
    config = _config(tmp_path, [{"url_env": "GW_HOOK_OK"}, {"url_env": "GW_HOOK_SLACK", "format": "slack"}])
    env = {"GW_HOOK_OK": hook.url("ok"), "GW_HOOK_SLACK": hook.url("slack")}
    asked, results, ran = Asked(), [], anyio.Event()
    with http_gateway(config, env) as gateway:
        assert gateway.url is not None
        async with contextlib.AsyncExitStack() as stack, httpx.AsyncClient(
            base_url=gateway.control(), trust_env=False, headers=gateway.control_headers()
        ) as http:
            clients = [
                await stack.enter_async_context(http_client(gateway.url, elicitation_callback=asked))
                for _ in range(calls)
            ]

            async def call(client: Any) -> None:
                results.append(await client.call_tool("github.add_deploy_key", KEY))
                ran.set()

            async with anyio.create_task_group() as group:
                for client in clients:
                    group.start_soon(call, client)
                first = set(await asked.until(calls))  # every call is waiting, asked in-band
                (pending,) = await pending_on(http)
                assert first == {pending["id"][:len(next(iter(first)))]}, asked.ids  # one question for all
                approve = await http.post(f"/approvals/{pending['id']}/approve", json={"resolved_by": "op-ann"})
                assert approve.status_code == 200
                asked.release[next(iter(first))].set()
                with anyio.fail_after(WAIT):
                    await ran.wait()
                # One approval lets one call through: the others share the next question.
                again = set((await asked.until(2 * calls - 1))[calls:])
                (second,) = await pending_on(http)
                assert again == {second["id"][:len(next(iter(again)))]} and second["id"] != pending["id"], asked.ids
                await anyio.to_thread.run_sync(hook.wait, lambda: len(hook.to("ok")) == len(hook.to("slack")) == 2)
                group.cancel_scope.cancel()
        _clean_log(gateway)
    assert len(results) == 1 and not results[0].is_error and "added" in text_of(results[0])
    assert [json.loads(body)["approval_id"] for body in hook.to("ok")] == [pending["id"], second["id"]]
    assert len(asked.ids) == 2 * calls - 1 and len(hook.to("slack")) == 2


@pytest.mark.parametrize(
    ("entry", "value", "says"),
    [
        ({"url_env": "GW_HOOK"}, f"http://example.com/{TOKEN}", "must hold an https:// URL"),
        ({"url_env": "GW_HOOK"}, f"https://xn--/{TOKEN}", "must hold an https:// URL with a valid host name"),
        ({"url_env": "GW_HOOK"}, f"https://a..example.com/{TOKEN}", "must hold an https:// URL with a valid host"),
        ({"url_env": "GW_HOOK"}, f"https://example.com:0/{TOKEN}", "a port (if any) from 1 to 65535"),
        ({"url_env": "GW_HOOK"}, None, "GW_HOOK is missing or empty"),
        ({"url_env": "GW_HOOK", "timeout_seconds": 0}, f"https://example.com/{TOKEN}", "timeout_seconds"),
        ({"url_env": "GW_HOOK", "url": f"https://example.com/{TOKEN}"}, f"https://example.com/{TOKEN}", "unknown key 'url'"),
        ({"url_env": "GW_HOOK", "format": "teams"}, f"https://example.com/{TOKEN}", "format must be one of json, slack"),
        ({"url_env": f"https://example.com/{TOKEN}"}, None, "url_env is not an environment variable name"),
    ],
)
def test_a_bad_target_stops_the_start_in_one_line_that_never_shows_the_url(
    tmp_path: Path, entry: dict[str, Any], value: str | None, says: str
) -> None:
    config = _config(tmp_path, [entry])
    env = child_env({"GW_HOOK": value} if value is not None else None)
    if value is None:
        env.pop("GW_HOOK", None)
    done = subprocess.run(
        serve_argv(config), capture_output=True, text=True, env=env, timeout=scaled(60), stdin=subprocess.DEVNULL
    )
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and says in done.stderr, done.stderr
    assert str(config) in done.stderr and "approval.notify[0]" in done.stderr
    assert TOKEN not in done.stderr and "example.com" not in done.stderr


async def test_wrap_posts_the_questions_it_opens_and_never_hands_the_url_to_its_server(
    tmp_path: Path, hook: Hook
) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "name: p\nagent: '*'\nrules:\n  - tools: ['env']\n    action: allow\n"
        "  - tools: ['echo']\n    action: human_approval\n", encoding="utf-8",
    )
    flags = wrap_flags(
        policy, tmp_path / "evidence", "--state", str(tmp_path / "state.db"), "--non-blocking-approvals",
        "--notify-url-env", "GW_HOOK_SLACK", "--notify-format", "slack",
    )
    env = {"GW_HOOK_SLACK": hook.url("slack")}
    async with connect(wrap_params([PYTHON, str(SERVERS / "crashy.py")], *flags, env=env)) as client:
        asked = await client.call_tool("echo", {"text": ARGUMENT})
        assert asked.is_error and "Approval required" in text_of(asked)
        seen = await client.call_tool("env", {"names": ["GW_HOOK_SLACK", "PATH"]})
        await anyio.to_thread.run_sync(hook.wait, lambda: len(hook.to("slack")) == 1)
    assert seen.structured_content == {"GW_HOOK_SLACK": False, "PATH": True}
    (requested,) = [entry["body"] for entry in trace(tmp_path / "evidence", "approval_requested")]
    text = json.loads(hook.to("slack")[0])["text"]
    assert f"approval {requested['approval_id'][:8]} pending: agent tester asks to run echo" in text
    assert ARGUMENT not in text


@pytest.mark.parametrize(
    ("flags", "value", "says"),
    [
        (["--notify-url-env", "GW_HOOK"], f"http://example.com/{TOKEN}",
         "drawbridge: --notify-url-env: environment variable GW_HOOK must hold an https:// URL"),
        (["--notify-url-env", "GW_HOOK"], f"https://xn--/{TOKEN}", "environment variable GW_HOOK must hold"),
        (["--notify-url-env", f"https://example.com/{TOKEN}"], None,
         "drawbridge: --notify-url-env: the value given is not an environment variable name"),
        (["--notify-format", "slack"], None, "--notify-format needs --notify-url-env"),
    ],
)
def test_wrap_refuses_a_notify_flag_that_names_no_webhook_in_one_line_without_the_url(
    tmp_path: Path, flags: list[str], value: str | None, says: str
) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("name: p\nagent: '*'\nrules:\n  - tools: ['*']\n    action: human_approval\n", encoding="utf-8")
    argv = [PYTHON, "-m", "drawbridge", "wrap", "--policy", str(policy), *flags, "--",
            PYTHON, str(SERVERS / "crashy.py")]
    done = subprocess.run(argv, capture_output=True, text=True, env=child_env({"GW_HOOK": value} if value else None),
                          timeout=scaled(60), stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and TOKEN not in done.stderr and "example.com" not in done.stderr, done.stderr
    if value is not None or flags[0] == "--notify-url-env":
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("timeout", [".nan", ".inf", "-1", "61", "true"])
def test_a_timeout_that_is_not_a_finite_positive_number_is_refused(tmp_path: Path, timeout: str) -> None:
    text = (
        "upstreams: [{name: a, transport: stdio, command: x}]\npolicy_dir: ./p\n"
        f"approval:\n  notify:\n    - {{url_env: GW_HOOK, timeout_seconds: {timeout}}}\n"
    )
    with pytest.raises(ConfigError, match=r"drawbridge.yaml:5: approval.notify\[0\].timeout_seconds must be"):
        parse_config(text, str(tmp_path / "drawbridge.yaml"), {"GW_HOOK": "https://hooks.example.com/x"})


def test_only_a_command_that_posts_reads_the_variable(tmp_path: Path) -> None:
    text = "upstreams: [{name: a, transport: stdio, command: x}]\npolicy_dir: ./p\napproval: {notify: [{url_env: GW_HOOK}]}\n"
    offline = parse_config(text, str(tmp_path / "drawbridge.yaml"), {}, uses=frozenset())
    assert offline.approval_notify == () and "GW_HOOK" in offline.credential_env
    loopback = parse_config(text, str(tmp_path / "drawbridge.yaml"), {"GW_HOOK": "http://[::1]:9/x"})
    assert loopback.approval_notify[0].url == "http://[::1]:9/x" and "[::1]" not in repr(loopback.approval_notify)


def _notice(agent: str, tool: str, console: str | None = None) -> PendingNotice:
    return PendingNotice("0123456789abcdef", agent, tool, "p #0 (p.yaml)", "needs a person", "2026-01-01T00:00:00Z", console)


def test_slack_text_shows_a_mention_or_link_in_a_name_and_never_makes_one() -> None:
    text = slack_body(_notice("<!channel>", "x.<@U123>&<https://evil.example|click>", CONSOLE + "/a"))["text"]
    assert "<@" not in text and "<!" not in text and "<https://evil" not in text
    assert "&lt;@U123&gt;&amp;&lt;https://evil.example|click&gt;" in text and "&lt;!channel&gt;" in text
    assert text.endswith(f"<{CONSOLE}/a|Open in the console>") and text.count("<") == 1


def test_a_notice_carries_no_control_character_and_bounded_names() -> None:
    body = json_body(_notice("guest", "evil\n\u202etool\x1b[2J" + "x" * 500))
    assert body["tool"].startswith("evil\ufffd\ufffdtool\ufffd[2J") and len(body["tool"]) == 256
    assert "console" not in body and list(body)[0] == "event"
    assert json.loads(notice_bytes(_notice("a", "b"), "slack")) == slack_body(_notice("a", "b"))


async def test_a_full_queue_drops_with_a_warning_counting_the_drops(caplog: pytest.LogCaptureFixture) -> None:
    now = datetime.now(UTC)
    approval = Approval(
        "f" * 32, "guest", "github.delete_repo", "digest", None, None, "needs a person", None, None, None, (),
        ApprovalStatus.PENDING, now, now + timedelta(minutes=1),
    )
    notifier = ApprovalNotifier([NotifyTarget("GW_HOOK", "https://hooks.example.com/x")], console=False, queue_size=2)
    with caplog.at_level(logging.WARNING, "drawbridge.activity"):
        for _ in range(4):
            notifier.pending(approval)
    drops = [record.__dict__["activity"] for record in caplog.records]
    assert [(d["event"], d["target"], d["dropped"]) for d in drops] == [
        ("approval_notify_dropped", "GW_HOOK", 1), ("approval_notify_dropped", "GW_HOOK", 2),
    ]


async def test_a_receivers_answer_is_never_read_into_memory(hook: Hook, caplog: pytest.LogCaptureFixture) -> None:
    now = datetime.now(UTC)
    approval = Approval(
        "e" * 32, "guest", "github.delete_repo", "digest", None, None, "needs a person", None, None, None, (),
        ApprovalStatus.PENDING, now, now + timedelta(minutes=1),
    )
    notifier = ApprovalNotifier([NotifyTarget("GW_HOOK_BIG", hook.url("big"))], console=False)
    with caplog.at_level(logging.WARNING, "drawbridge.activity"):
        async with anyio.create_task_group() as group:
            await group.start(notifier.run)
            notifier.pending(approval)
            assert await anyio.to_thread.run_sync(hook.big_done.wait, WAIT)
            group.cancel_scope.cancel()
    assert len(hook.to("big")) == 1 and not caplog.records  # delivered at the first attempt
    # Closed unread: the receiver got no further than the sockets' buffers (a few MiB), not the whole body.
    assert hook.big_sent < BIG // 4, hook.big_sent
