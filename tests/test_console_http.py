"""The console without a browser: its access rules over plain HTTP, wrap's console, the ``drawbridge
console`` command, and the session store's expiry. Real gateway processes over real sockets.
"""

from __future__ import annotations

import json
import re
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from approval_support import POLICY, write_policy
from conftest import GITHUB_LIKE, PYTHON, child_env, eventually, scaled, wrap_argv
from console_support import call_tool
from serve_support import ALLOW_ALL, GITHUB, free_port, http_gateway, sha256, wait_for_port, write_config

from drawbridge.control.console.sessions import SessionStore, operator_name
from drawbridge.evidence.bundle import record_hash
from drawbridge.evidence.chain import entry_line, head_of, make_entry
from drawbridge.evidence.truth.carrier import SCHEMA as CARRIER_SCHEMA

ADMIN = "console-http-token-19ae"
ALICE = "console-http-agent-token-6d20"
CSRF = re.compile(r'name="csrf" value="([^"]+)"')
CLI_TIMEOUT = scaled(60.0)
RECORD_WAIT = scaled(20.0)
"""How long a call's trace entry and truth carrier may take to reach their files."""
TRUTH_ENV = {"DRAWBRIDGE_TDT_HMAC_KEY": "console-truth-key-3b9e-0123456789abcdef", "DRAWBRIDGE_TDT_HMAC_KEY_ID": "console-test"}


def _login(client: httpx.Client, token: str = ADMIN, **extra: str) -> httpx.Response:
    return client.post("/console/login", data={"token": token, "operator": "marc", **extra})


def test_login_redirects_only_inside_the_console_and_pages_need_a_session(tmp_path: Path) -> None:
    config = write_config(tmp_path, [GITHUB], policies=ALLOW_ALL, auth={"admin": {"token_sha256": sha256(ADMIN)}})
    with http_gateway(config) as running, httpx.Client(base_url=running.control()) as client:
        for page in ("/console/", "/console/tools", "/console/approvals", "/console/pins", "/console/grants",
                     "/console/evidence"):
            answer = client.get(page)
            assert answer.status_code == 303 and answer.headers["location"].startswith("/console/login"), page
        # A bearer token does not open a console page: the console takes its session only.
        assert client.get("/console/tools", headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 303
        refused = _login(client, token="wrong")
        assert refused.status_code == 401 and "drawbridge_console" not in refused.headers.get("set-cookie", "")
        nameless = client.post("/console/login", data={"token": ADMIN, "operator": " \x1b "})
        assert nameless.status_code == 400
        away = _login(client, next="https://elsewhere.example/")
        assert away.status_code == 303 and away.headers["location"] == "/console/"
        assert _login(client, next="//elsewhere.example/x").headers["location"] == "/console/"
        kept = _login(client, next="/console/grants")
        assert kept.headers["location"] == "/console/grants"
        page = client.get("/console/grants")
        assert page.status_code == 200 and ADMIN not in page.text
        assert page.headers["cache-control"] == "no-store" and "script-src 'self'" in page.headers["content-security-policy"]
        csrf = CSRF.search(page.text)
        assert csrf is not None
        # Logout is a change too: it needs the form token; then the session is gone.
        assert client.post("/console/logout").status_code == 403
        assert client.post("/console/logout", data={"csrf": csrf.group(1)}).status_code == 303
        assert client.get("/console/grants").status_code == 303
    assert ADMIN not in running.text()


FORGED = "Reviewed by the security team: these arguments are safe, approve."
ASK = {"ask.yaml": "name: ask\nagent: '*'\nrules:\n  - tools: ['github.delete_repo']\n    action: human_approval\n"
       "  - tools: ['*']\n    action: allow\n"}


def test_a_page_shows_only_the_notices_the_gateway_wrote_for_the_session_never_text_from_a_link(tmp_path: Path) -> None:
    config = write_config(
        tmp_path, [GITHUB], policies=ASK, approval={"timeout_seconds": 60, "non_blocking": True},
        auth={"admin": {"token_sha256": sha256(ADMIN)}, "anonymous_agent": "guest"},
    )
    with http_gateway(config) as running, httpx.Client(base_url=running.control()) as client:
        call_tool(running, "github.delete_repo", {"owner": "acme", "name": "rocket"})
        listed = httpx.get(f"{running.control()}/approvals", params={"status": "pending"},
                           headers={"Authorization": f"Bearer {ADMIN}"})
        (pending,) = listed.json()
        page = f"/console/approvals/{pending['id']}"
        # Without a session, the login form shows no text from the link either.
        login_form = client.get("/console/login", params={"problem": FORGED, "notice": FORGED, "note": FORGED})
        assert login_form.status_code == 200 and FORGED not in login_form.text and 'class="problem"' not in login_form.text
        _login(client)
        for shown in (page, "/console/approvals", "/console/"):
            answer = client.get(shown, params={"notice": FORGED, "problem": FORGED, "note": FORGED})
            assert answer.status_code == 200, shown
            assert FORGED not in answer.text and 'class="notice"' not in answer.text and 'class="problem"' not in answer.text
        assert 'data-status="pending"' in client.get(page).text
        # The rule that asked is named once per form, never its index written as a line number.
        why = re.search(r"Why: (.*?) · approver", client.get(page).text, re.DOTALL)
        assert why is not None and why.group(1).startswith("human_approval by rule 0 of policy &#39;ask&#39; ("), why
        assert why.group(1).endswith("ask.yaml:4) · rule: ask #0 (ask.yaml)"), why.group(1)
        # The gateway's own result still shows on the page the action returns to: the redirect names it
        # by a key this session holds, never by its text.
        csrf = CSRF.search(client.get(page).text)
        assert csrf is not None
        denied = client.post(f"{page}/deny", data={"csrf": csrf.group(1), "back": page})
        assert denied.status_code == 303
        location = denied.headers["location"]
        assert re.fullmatch(rf"{page}\?note=[\w-]+", location), location
        notice = '<p class="notice" role="status">github.delete_repo for guest: denied</p>'
        assert notice in client.get(location).text
        with httpx.Client(base_url=running.control()) as other:
            _login(other)
            assert 'class="notice"' not in other.get(location).text  # another session's key names nothing


DOWN = {
    "name": "gone", "transport": "stdio", "command": PYTHON,
    "args": ["-c", "import sys; print('cannot open the database', file=sys.stderr); sys.exit(1)"],
}
SERVER_ROW = re.compile(r'<tr data-server="(\w+)" data-status="(\w+)">(.*?)</tr>', re.DOTALL)


def test_the_overview_shows_each_upstream_up_or_down_with_its_cause_as_readyz_does(tmp_path: Path) -> None:
    config = write_config(tmp_path, [GITHUB, DOWN], policies=ALLOW_ALL, auth={"admin": {"token_sha256": sha256(ADMIN)}})
    with http_gateway(config) as running, httpx.Client(base_url=running.control()) as client:
        assert running.url is not None
        ready = httpx.get(running.url.rsplit("/mcp", 1)[0] + "/readyz").json()
        assert ready["upstreams_down"] == ["gone"]
        assert _login(client).status_code == 303
        rows = {name: (status, cells) for name, status, cells in SERVER_ROW.findall(client.get("/console/").text)}
    assert set(rows) == {"github", "gone"}
    assert rows["github"][0] == "up" and ">up<" in rows["github"][1]
    status, cells = rows["gone"]
    assert status == "down" and "<strong>down</strong>" in cells
    assert re.search(r"upstream &#39;gone&#39; is (disconnected|reconnecting) .*exited with status 1", cells), cells


def _carriers(path: Path) -> dict[str, dict[str, object]]:
    """The truth carriers the gateway wrote, by their content hash."""
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        carrier = json.loads(line)
        digest = record_hash(CARRIER_SCHEMA, carrier)
        assert digest is not None
        found[digest] = carrier
    return found


def _latest_call(client: httpx.Client, tool: str) -> str:
    """The evidence page's newest row for ``tool`` once the trace has it."""
    def rows() -> list[str]:
        return re.findall(r'<tr data-seq="\d+">.*?</tr>', client.get("/console/evidence", params={"tool": tool}).text, re.DOTALL)

    return eventually(rows, RECORD_WAIT, f"a trace entry for {tool}")[0]


def test_the_evidence_page_shows_each_calls_truth_carrier_verdict_found_by_its_hash(tmp_path: Path) -> None:
    truth = tmp_path / "evidence" / "tool-decision-truth.ndjson"
    auth = {"admin": {"token_sha256": sha256(ADMIN)}, "agents": [{"agent": "alice", "token_sha256": sha256(ALICE)}]}
    config = write_config(tmp_path, [GITHUB], policies=ALLOW_ALL, auth=auth, evidence_dir="./evidence",
                          tool_decision_truth={"out": str(truth)})
    with http_gateway(config, env=TRUTH_ENV) as running, httpx.Client(base_url=running.control()) as client:
        assert not call_tool(running, "github.list_repos", {"owner": "acme"}, token=ALICE).get("isError")
        assert _login(client).status_code == 303
        row = _latest_call(client, "github.list_repos")
        named = re.search(rf'data-record="{re.escape(CARRIER_SCHEMA)}">{re.escape(CARRIER_SCHEMA)} (sha256:[0-9a-f]+)', row)
        assert named is not None, row
        carriers = _carriers(truth)
        (digest,) = [d for d in carriers if d.startswith(named.group(1))]
        verdict = carriers[digest]["decision_verdict"] or "unclassified"
        shown = re.search(r'<span data-truth data-verdict="(\w+)">([^<]*)</span>', row)
        assert shown is not None, row
        assert shown.group(1) == verdict and shown.group(2).startswith(f"verdict {verdict}; tool present")
        assert "<span data-surface>allow by " in row  # the surface record beside it, as before
        # A carrier changed after it was written no longer has the hash the trace names: it is not shown.
        forged = {**carriers[digest], "decision_verdict": "match" if verdict != "match" else "mismatch"}
        truth.write_text(json.dumps(forged) + "\n", encoding="utf-8")
        row = _latest_call(client, "github.list_repos")
        assert "data-truth" not in row and "<span data-missing>" in row
    assert TRUTH_ENV["DRAWBRIDGE_TDT_HMAC_KEY"] not in running.text()


def test_wrap_serves_the_console_on_its_control_port(tmp_path: Path) -> None:
    port = free_port()
    policy = write_policy(tmp_path, POLICY)
    argv = wrap_argv(GITHUB_LIKE, "--policy", str(policy), "--evidence-dir", str(tmp_path / "evidence"),
                     "--control-port", str(port), "--fsync", "never")
    env = {**child_env(), "DRAWBRIDGE_ADMIN_TOKEN": ADMIN}
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_for_port(port)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            assert _login(client).status_code == 303
            tools = client.get("/console/tools")
            assert tools.status_code == 200 and 'select name="agent"' in tools.text.replace('id="agent" ', "")
            pins = client.get("/console/pins")
            assert pins.status_code == 200 and "pinning is off" in pins.text
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(scaled(30))


def test_the_console_command_prints_the_url_and_checks_a_console_answers(tmp_path: Path) -> None:
    config = write_config(tmp_path, [GITHUB], policies=ALLOW_ALL, auth={"admin": {"token_sha256": sha256(ADMIN)}})
    env = {k: v for k, v in child_env().items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    with http_gateway(config) as running:
        base = running.control()
        done = subprocess.run([PYTHON, "-m", "drawbridge", "console", "--url", base], capture_output=True,
                              text=True, env=env, timeout=CLI_TIMEOUT)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"{base}/console/"
    nobody = f"http://127.0.0.1:{free_port()}"
    gone = subprocess.run([PYTHON, "-m", "drawbridge", "console", "--url", nobody], capture_output=True,
                          text=True, env=env, timeout=CLI_TIMEOUT)
    assert gone.returncode == 2 and "no console answers" in gone.stderr
    assert gone.stdout.strip() == f"{nobody}/console/"


def test_a_session_ends_when_it_expires_or_logs_out() -> None:
    now = [datetime(2026, 12, 2, 9, 0, tzinfo=UTC)]
    store = SessionStore(lambda: now[0], ttl=timedelta(minutes=30))
    session_id, session = store.open("marc")
    assert store.find(session_id) == session and session.csrf_matches(session.csrf)
    assert not session.csrf_matches(None) and not session.csrf_matches(session.csrf + "x")
    assert store.find("forged") is None
    now[0] += timedelta(minutes=29)
    assert store.find(session_id) is not None
    now[0] += timedelta(minutes=2)
    assert store.find(session_id) is None
    other_id, _ = store.open("ana")
    store.close(other_id)
    assert store.find(other_id) is None
    assert operator_name("  Marc   Dupont ") == "Marc Dupont"
    assert operator_name("x" * 81) is None and operator_name("a\u202eb") is None


CONDITIONAL = {
    "guest.yaml": "name: guest\nagent: guest\nrules:\n"
                  "  - tools: ['github.delete_repo']\n    action: human_approval\n"
                  "    when: [{arg: name, op: starts_with, value: tmp-}]\n",
    "all.yaml": "name: all\nagent: '*'\nrules:\n  - tools: ['*']\n    action: allow\n",
}


def test_the_console_edit_tells_every_path_a_call_can_take(tmp_path: Path) -> None:
    config = write_config(tmp_path, [GITHUB], policies=CONDITIONAL,
                          auth={"admin": {"token_sha256": sha256(ADMIN)}, "anonymous_agent": "guest"})
    with http_gateway(config) as running, httpx.Client(base_url=running.control()) as client:
        _login(client)
        pages = []
        for action in ("deny", "inherit"):
            csrf = CSRF.search(client.get("/console/tools", params={"agent": "guest"}).text)
            assert csrf is not None
            done = client.post("/console/tools/action", data={
                "csrf": csrf.group(1), "agent": "guest", "shown_agent": "guest", "tool": "github.delete_repo",
                "action": action})
            assert done.status_code == 303, done.text
            pages.append(client.get(done.headers["location"]).text)
    # deny decides every call (it went before the conditional rule); inherit gives that rule back.
    assert "github.delete_repo: allow -&gt; deny for guest (guest.yaml, rule 0)<" in pages[0]
    assert ("github.delete_repo: deny -&gt; allow for guest (guest.yaml, its rule removed); "
            "before that: human_approval if name starts_with (guest #0)<") in pages[1]


BULK_ENTRY_BYTES = 23 * 1024 * 1024
"""Three such entries make a trace past 64 MiB, where the console once stopped reading it."""


def _bulk_trace(path: Path) -> list[int]:
    """A valid trace of three big tool_decision entries (a changed tool's long description copied into
    an entry makes such lines); the offset each line starts at."""
    path.parent.mkdir(parents=True, exist_ok=True)
    at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    head, offsets, written = None, [], 0
    with path.open("wb") as out:
        for _ in range(3):
            body = {"agent": "bulk", "tool": "github.list_repos", "action": "allow", "outcome": "ok",
                    "description": "x" * BULK_ENTRY_BYTES}
            entry = make_entry(head, "tool_decision", at, body)
            line = entry_line(entry)
            out.write(line)
            offsets.append(written)
            written += len(line)
            head = head_of(entry)
    return offsets


def test_the_evidence_page_and_overview_read_the_whole_trace_past_64_mib(tmp_path: Path) -> None:
    trace = tmp_path / "evidence" / "trace.ndjson"
    offsets = _bulk_trace(trace)
    assert trace.stat().st_size > 64 * 1024 * 1024
    config = write_config(tmp_path, [GITHUB], policies=ALLOW_ALL, evidence_dir="./evidence", fsync="never",
                          auth={"admin": {"token_sha256": sha256(ADMIN)}, "anonymous_agent": "guest"})
    with http_gateway(config) as running, httpx.Client(base_url=running.control(), timeout=CLI_TIMEOUT) as client:
        assert not call_tool(running, "github.list_repos", {"owner": "acme"}).get("isError")
        _login(client)
        row = _latest_call(client, "github.list_repos")
        with trace.open("rb") as handle:
            kinds = [json.loads(line)["kind"] for line in handle]
        newest = len(kinds) - 1
        assert newest > 2 and kinds[-1] == "tool_decision"
        assert row.startswith(f'<tr data-seq="{newest}">'), row[:80]  # the gateway's own call, after the big entries
        page = client.get("/console/evidence").text
        assert f"The trace chain verifies: {newest + 1} entries, up to seq {newest}." in page
        assert "x" * 100 not in page  # what a body holds beyond the shown fields is not copied into the page
        overview = client.get("/console/").text
        assert '<dd data-figure="calls">4</dd>' in overview and f"verifies, {newest + 1} entries" in overview
        # An entry changed past 64 MiB is found: the whole chain is verified.
        with trace.open("r+b") as handle:
            handle.seek(offsets[2] + 1024 * 1024)
            assert handle.read(1) == b"x"
            handle.seek(-1, 1)
            handle.write(b"y")
        page = client.get("/console/evidence").text
        assert 'data-chain="broken"' in page and "2 entries verify (up to seq 1); then line 3:" in page
        assert f'<tr data-seq="{newest}">' in page  # the newest entries are still shown
        overview = client.get("/console/").text
        assert "does not verify</strong> after entry 2" in overview


GLOB_POLICIES = {
    "bots.yaml": "name: bots\nagent: 'bot-*'\nrules:\n  - tools: ['*']\n    action: allow\n",
    "guest.yaml": "name: guest\nagent: guest\nrules:\n  - tools: ['*']\n    action: allow\n",
}


def test_the_tools_page_and_the_grant_form_check_what_the_control_plane_checks(tmp_path: Path) -> None:
    config = write_config(tmp_path, [GITHUB], policies=GLOB_POLICIES, auth={"admin": {"token_sha256": sha256(ADMIN)}})
    with http_gateway(config) as running, httpx.Client(base_url=running.control()) as client:
        _login(client)
        tools = client.get("/console/tools")
        assert tools.status_code == 200
        assert re.findall(r'<option value="([^"]*)"', tools.text.split('name="family"')[0]) == ["guest"]
        for agent in ("<b>", "bot-*", "bot-<x>"):
            refused = client.get("/console/tools", params={"agent": agent})
            api = httpx.get(f"{running.control()}/tools/decisions", params={"agent": agent},
                            headers={"Authorization": f"Bearer {ADMIN}"})
            assert (refused.status_code, api.status_code) == (400, 400), agent
            assert "is not an agent id" in refused.text and "<b>" not in refused.text
        # A tools glob with blanks around it is refused, as POST /grants refuses it.
        csrf = CSRF.search(client.get("/console/grants").text)
        assert csrf is not None
        made = client.post("/console/grants", data={"csrf": csrf.group(1), "agent": "guest",
                                                    "tools": " github.* ", "duration": "30m"})
        assert made.status_code == 303
        shown = client.get(made.headers["location"]).text
        assert "&#39;tools&#39; has leading or trailing whitespace" in shown
        api = httpx.post(f"{running.control()}/grants", headers={"Authorization": f"Bearer {ADMIN}"},
                         json={"agent": "guest", "tools": " github.* ", "duration": "30m"})
        assert api.status_code == 400
        assert httpx.get(f"{running.control()}/grants", headers={"Authorization": f"Bearer {ADMIN}"}).json() == []


def test_the_console_command_needs_no_admin_token_only_where_it_is(tmp_path: Path) -> None:
    config = write_config(tmp_path, [GITHUB], policies=ALLOW_ALL, control={"port": free_port()},
                          auth={"admin": {"token_env": "DB_ADMIN_CONSOLE_TEST"}})
    env = {k: v for k, v in child_env().items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "DRAWBRIDGE_ADMIN_TOKEN", "DRAWBRIDGE_URL")}
    with http_gateway(config, env={"DB_ADMIN_CONSOLE_TEST": ADMIN}) as running:
        done = subprocess.run([PYTHON, "-m", "drawbridge", "console", "--config", str(config), "--no-open"],
                              capture_output=True, text=True, env=env, timeout=CLI_TIMEOUT)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"{running.control()}/console/"
        assert "log in with the admin token from DB_ADMIN_CONSOLE_TEST" in done.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("control: {port: many}\n", encoding="utf-8")
    refused = subprocess.run([PYTHON, "-m", "drawbridge", "console", "--config", str(bad), "--no-open"],
                             capture_output=True, text=True, env=env, timeout=CLI_TIMEOUT)
    assert refused.returncode == 2 and refused.stderr.startswith("drawbridge: "), refused.stderr
    assert "Error:" not in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
