"""``result_guards``: secrets redacted from tool results and results held to a size, under serve (both
eras; MCP, OpenAPI and CLI upstreams) and wrap, through the official ``mcp`` SDK client; what is recorded
of it (the trace's ``result_guard``, the decision line's ``guard``, ``drawbridge_result_guard_total``)
and that no secret reaches the evidence, the state or the logs; the configuration's errors.

The detectors and the cut are checked on their own first, each detector with a real-looking sample
and a near miss."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from approval_support import decisions
from mcp.shared.exceptions import MCPError
from openapi_support import items_entry, openapi_backend
from conftest import ERAS, LEGACY_VERSION, PYTHON, SERVERS, RawPipe, child_env, connect, scaled, wrap_argv, wrap_params
from serve_support import Running, fields_of, http_client, http_gateway, initialize_request, serve_argv, write_config

from drawbridge.config import parse_config
from drawbridge.config_guards import ResultGuardRule
from drawbridge.config_reader import ConfigError
from drawbridge.gateway.pipeline.result_guards import ResultGuards
from drawbridge.gateway.pipeline.result_text import result_size
from drawbridge.policy.globs import compile_glob
from drawbridge.policy.secret_patterns import BUILTIN, Detector, check_secret_regex

pytestmark = pytest.mark.anyio

LEAKY = [PYTHON, str(SERVERS / "leaky.py")]
GITHUB_TOKEN = "ghp_" + "R8x2Kp4Qw7Zt1Vb9Nm3Lc6Hd0Fs5Gj2Ya8Ue"
AWS_KEY = "AKIA" + "Q3ZL7XWJ2MNB5R6T"
ACME_KEY = "ACME-" + "0123456789abcdef" * 2
SECRETS = (GITHUB_TOKEN, AWS_KEY, ACME_KEY)
CALL_SECONDS = scaled(30.0)

GUARDS = [
    {"tools": ["leaky.dump_log", "leaky.snapshot"], "max_bytes": 4096},
    {"tools": ["leaky.*", "env.*"], "redact_secrets": True, "secret_patterns": {"acme_key": "ACME-[0-9a-f]{32}"}},
]


# ------------------------------------------------------------------------------ the detectors


SAMPLES = {
    "pem_private_key": (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7Vx1\nq2w3e4r5t6y7\n-----END RSA PRIVATE KEY-----",
        "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8A\n-----END PUBLIC KEY-----",
    ),
    "aws_access_key_id": ("id=ASIA" + "Y7TQ2MZ4KX9W3LPB,", "AKIA" + "Y7TQ2MZ4KX9W3LP (15) and AKIA" + "Y7TQ2MZ4KX9W3LPBQ (17)"),
    "github_token": (GITHUB_TOKEN, "ghp_tooShort123 and xghp_" + "a" * 36 + "b"),
    "slack_token": ("xoxb-" + "123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx", "xoxz-123456789012-abcdefghij"),
    "stripe_live_key": ("sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc", "sk_test_4eC39HqLyjWDarjtT1zdp7dc"),
    "google_api_key": ("AIza" + "SyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY", "AIza" + "SyD-9tSrke72PouQMnMX-a7eZSW0jkFMBW"),
    "jwt": (
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "eyJhbGciOiJIUzI1NiJ9 is a header only",
    ),
    "bearer_token": ("Authorization: Bearer 9f8e7d6c5b4a39281706f5e4d3c2b1a0", "send a Bearer token in the header"),
    "url_credentials": ("postgres://admin:hunter2secret@db.internal:5432/app", "https://user@example.com and https://example.com:8443/"),
}


def guards(**rule: Any) -> ResultGuards:
    return ResultGuards([ResultGuardRule(index=0, tools=(compile_glob("*"),), agents=(compile_glob("*"),), **rule)])


def text_result(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}]}


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_each_detector_finds_its_sample_and_leaves_its_near_miss(kind: str) -> None:
    assert {detector.kind for detector in BUILTIN} == set(SAMPLES)
    sample, near_miss = SAMPLES[kind]
    guarded = guards(redact_secrets=True).apply("a", "t", text_result(f"before {sample} after"))
    assert guarded is not None
    result, report = guarded
    text = result["content"][0]["text"]
    assert f"[drawbridge: redacted {kind}]" in text and text.startswith("before ") and text.endswith(" after")
    assert report.secrets == ((kind, 1),) and report.log_field() == f"redacted:{kind}*1"
    assert guards(redact_secrets=True).apply("a", "t", text_result(near_miss)) is None


def test_secrets_are_redacted_in_structured_keys_and_values_resources_and_errors_but_not_blobs() -> None:
    result = {
        "content": [
            {"type": "resource", "resource": {"uri": "file:///x", "text": f"key {AWS_KEY}"}},
            {"type": "image", "data": "QUtJQV" + AWS_KEY, "mimeType": "image/png"},
        ],
        "structuredContent": {GITHUB_TOKEN: [{"nested": f"is {GITHUB_TOKEN}"}]},
        "isError": True,
    }
    guarded = guards(redact_secrets=True).apply("a", "t", result)
    assert guarded is not None
    out, report = guarded
    assert out["content"][0]["resource"]["text"] == "key [drawbridge: redacted aws_access_key_id]"
    assert out["content"][1]["data"] == "QUtJQV" + AWS_KEY  # an image's base64 is not text
    assert out["structuredContent"] == {
        "[drawbridge: redacted github_token]": [{"nested": "is [drawbridge: redacted github_token]"}]
    }
    assert out["isError"] is True and dict(report.secrets) == {"aws_access_key_id": 1, "github_token": 2}


def test_a_result_built_to_make_the_detectors_backtrack_is_scanned_in_bounded_time() -> None:
    """Every detector's prefix, followed by what makes it try longest and fail, over and over."""
    bait = ["-----BEGIN PRIVATE KEY-----" + "A" * 200 + "!", "xoxb-" + "1" * 20 + "-" + "a" * 300, "eyJ" + "a" * 5000,
            "Bearer " + "a" * 5000 + "=" * 50 + "!", "https://" + "a" * 300 + ":" + "b" * 300, "ghp_" + "a" * 300,
            "github_pat_" + "a" * 300, "AIza" + "a" * 40, "sk_live_" + "a" * 300]
    text = " ".join(bait * 40)
    started = time.monotonic()
    guarded = guards(redact_secrets=True, secret_patterns=(Detector("acme", check_secret_regex("ACME-[0-9a-f]{32}")),))
    guarded.apply("a", "t", text_result(text))
    assert time.monotonic() - started < scaled(5.0)


def test_refusing_a_secret_names_its_kind_never_its_value() -> None:
    guarded = guards(redact_secrets=True, on_secret="refuse").apply("a", "t", {"resultType": "complete", **text_result(AWS_KEY)})
    assert guarded is not None
    out, report = guarded
    assert out["isError"] is True and out["resultType"] == "complete"
    assert "withheld: it held a secret (aws_access_key_id)" in out["content"][0]["text"]
    assert AWS_KEY not in json.dumps(out) and report.log_field() == "refused:secret:aws_access_key_id*1"


def test_a_cut_stays_within_the_limit_and_never_splits_a_character() -> None:
    result = {"content": [{"type": "text", "text": "é" * 3000}, {"type": "image", "data": "A" * 100, "mimeType": "image/png"}],
              "structuredContent": {"v": 1}}
    guarded = guards(max_bytes=2049).apply("a", "t", result)
    assert guarded is not None
    out, report = guarded
    kept, notice = out["content"][0]["text"], out["content"][-1]["text"]
    assert set(kept) == {"é"} and len(out["content"]) == 2 and "structuredContent" not in out and out["isError"] is True
    assert result_size(out) <= 2049 and report.size == result_size(result)
    assert notice.startswith(f"[drawbridge: result cut at 2049 bytes (result_guards); {report.cut_bytes} more bytes")
    assert "1 content item(s) that cannot be cut" in notice
    assert "structuredContent was dropped (a cut one would not match the tool's output schema), so the result is marked isError" in notice
    assert report.size == 6217 and 0 < report.size - report.cut_bytes <= 2049 - 512  # what was shown, the notice aside
    refused = guards(max_bytes=2049, on_oversize="refuse").apply("a", "t", result)
    assert refused is not None and refused[0]["isError"] is True
    assert "it is 6217 bytes, over the limit of 2049 bytes" in refused[0]["content"][0]["text"]
    assert guards(max_bytes=6217).apply("a", "t", result) is None


def test_the_first_matching_entry_applies_and_an_entry_that_guards_nothing_exempts() -> None:
    config = _config([{"tools": ["leaky.read_config"]}, {"tools": ["leaky.*"], "redact_secrets": True}])
    assert config.result_guards is not None
    found = ResultGuards(config.result_guards)
    assert found.rule_for("a", "leaky.read_config") is None
    rule = found.rule_for("a", "leaky.account")
    assert rule is not None and rule.index == 1


# --------------------------------------------------------------------------------- the config


def _config(entries: Any) -> Any:
    document = {"upstreams": [{"name": "x", "transport": "stdio", "command": "true"}], "policy_dir": ".",
                "result_guards": entries}
    return parse_config(json.dumps(document, indent=1), "drawbridge.yaml")


@pytest.mark.parametrize(("entries", "problem"), [
    ([], "result_guards is empty"),
    ({"tools": ["*"]}, "result_guards must be a list of entries"),
    ([{"tool": ["*"]}], "unknown key 'tool' in result_guards[0]"),
    ([{"tools": ["a[b"]}], "result_guards[0].tools: glob 'a[b' is not valid"),
    ([{"tools": []}], "result_guards[0].tools is empty"),
    ([{"agents": [3]}], "result_guards[0].agents must be a list of strings"),
    ([{"max_bytes": 10}], "result_guards[0].max_bytes must be between 1024 and"),
    ([{"max_bytes": 4096, "on_oversize": "cut"}], "on_oversize must be truncate or refuse"),
    ([{"on_oversize": "refuse"}], "on_oversize needs max_bytes"),
    ([{"redact_secrets": "yes"}], "redact_secrets must be true or false"),
    ([{"on_secret": "refuse"}], "on_secret needs redact_secrets: true or secret_patterns"),
    ([{"secret_patterns": {"k": "(a+)+b{1,2}"}}], "the pattern nests repetition"),
    ([{"secret_patterns": {"k": "KEY-[0-9]+"}}], "can match more than 4096 characters"),
    ([{"secret_patterns": {"k": "(a"}}], "the pattern is not valid"),
    ([{"secret_patterns": {"k": "[a-z]{1,600}X"}}], "could try too many ways at each position"),
    ([{"secret_patterns": {"jwt": "JWT-[0-9]{8}"}}], "'jwt' is the name of a built-in detector"),
    ([{"secret_patterns": {"Bad Name": "X{2}"}}], "the name 'Bad Name' must match"),
    ([{"tools": ["x"], "secret_patterns": {}}], "result_guards[0].secret_patterns is empty"),
])
def test_every_bad_entry_is_a_located_error(entries: Any, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _config(entries)
    assert problem in str(caught.value) and str(caught.value).startswith("drawbridge.yaml:")
    assert caught.value.line is not None


def test_serve_and_wrap_refuse_a_bad_guard_at_startup_in_one_line(tmp_path: Path) -> None:
    config = write_config(tmp_path, [{"name": "leaky", "transport": "stdio", "command": LEAKY[0], "args": LEAKY[1:]}],
                          result_guards=[{"max_bytes": 12}])
    served = subprocess.run(serve_argv(config), capture_output=True, text=True, timeout=scaled(60), env=child_env(),
                            stdin=subprocess.DEVNULL)
    assert served.returncode == 2, served.stderr
    (line,) = served.stderr.strip().splitlines()
    assert "result_guards[0].max_bytes must be between 1024" in line and "Traceback" not in served.stderr
    file = tmp_path / "guards.yaml"
    file.write_text("- tools: ['*']\n  on_secret: shred\n", encoding="utf-8")
    wrapped = subprocess.run(wrap_argv(LEAKY, "--allow-all", "--result-guards", str(file)), capture_output=True,
                             text=True, timeout=scaled(60), env=child_env(), stdin=subprocess.DEVNULL)
    assert wrapped.returncode == 2
    assert wrapped.stderr.strip() == f"drawbridge: {file}:2: result_guards[0].on_secret must be redact or refuse, not 'shred'"


# ------------------------------------------------------------------------------------- serve


def _texts(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


def _no_secret_anywhere(*places: Path, logs: str) -> None:
    """No secret, nor its SHA-256, in any file under ``places`` nor in the logs."""
    needles = [s.encode() for s in SECRETS] + [hashlib.sha256(s.encode()).hexdigest().encode() for s in SECRETS]
    files = [p for place in places for p in ([place] if place.is_file() else place.rglob("*")) if p.is_file()]
    assert files
    for path in files:
        data = path.read_bytes()
        assert not [n for n in needles if n in data], path
    assert not [n for n in needles if n.decode() in logs]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Running]:
    config = write_config(
        tmp_path, [{"name": "leaky", "transport": "stdio", "command": LEAKY[0], "args": LEAKY[1:]}],
        cli_tools=[{"name": "env", "bin": "printenv", "bare": {}, "env": {"LEAKED": GITHUB_TOKEN}}],
        evidence_dir=str(tmp_path / "evidence"), state_path=str(tmp_path / "state.db"),
        auth={"anonymous_agent": "guest"}, result_guards=GUARDS,
    )
    with http_gateway(config) as running:
        yield running


@pytest.mark.parametrize("mode", ERAS)
async def test_serve_redacts_and_cuts_what_tools_return(served: Running, tmp_path: Path, mode: str) -> None:
    assert served.url is not None
    async with http_client(served.url, mode=mode) as client:
        with anyio.fail_after(CALL_SECONDS):
            config = await client.call_tool("leaky.read_config", {})
            account = await client.call_tool("leaky.account", {})
            broken = await client.call_tool("leaky.broken", {})
            log = await client.call_tool("leaky.dump_log", {"kib": 16})
            snapshot = await client.call_tool("leaky.snapshot", {"kib": 8})
            cli = await client.call_tool("env.run", {"args": ["LEAKED"]})
            with pytest.raises(MCPError) as rejected:
                await client.call_tool("leaky.rejected", {})
    text = _texts(config)
    assert "github: [drawbridge: redacted github_token]" in text and "aws: [drawbridge: redacted aws_access_key_id]" in text
    assert "acme: [drawbridge: redacted acme_key]" in text
    assert "not secrets: ghp_short AKIA1234 sk_test_0000000000000000000000 https://user@example.com" in text
    assert account.structured_content == {
        "owner": "ops", "token": "[drawbridge: redacted github_token]", "[drawbridge: redacted github_token]": "as a key"
    }
    assert broken.is_error and "login failed with [drawbridge: redacted aws_access_key_id]" in _texts(broken)
    kept, notice = log.content[0], log.content[-1]
    assert isinstance(kept, types.TextContent) and isinstance(notice, types.TextContent)
    assert set(kept.text) == {"é"} and len(kept.text.encode()) <= 4096 - 512 and log.is_error
    assert notice.text.startswith("[drawbridge: result cut at 4096 bytes (result_guards); ")
    assert [block.type for block in snapshot.content] == ["text", "text"]  # the image did not fit: dropped
    assert "1 content item(s) that cannot be cut" in _texts(snapshot)
    assert "[drawbridge: redacted github_token]" in _texts(cli) and cli.structured_content is not None
    assert cli.structured_content["stdout"] == "[drawbridge: redacted github_token]\n"
    assert rejected.value.error.message == "upstream refused credential [drawbridge: redacted github_token]"
    assert rejected.value.error.data == {"token": "[drawbridge: redacted github_token]"}
    for result in (config, account, broken, log, snapshot, cli):
        assert not any(secret in json.dumps(result.model_dump(mode="json")) for secret in SECRETS)

    recorded = {d["tool"]: d.get("result_guard") for d in decisions(tmp_path / "evidence")}
    # Each secret twice: in the text, and again in the SDK's structured output of the same value.
    assert recorded["leaky.read_config"] == {"entry": 1, "secrets": {"acme_key": 2, "aws_access_key_id": 2, "github_token": 2}}
    assert recorded["leaky.account"] == {"entry": 1, "secrets": {"github_token": 4}}
    size = 2 * 16384 + 89  # the result's JSON: the text, and again as the SDK's structured output {"result": ...}
    cut_log = recorded["leaky.dump_log"]
    assert {**cut_log, "cut_bytes": 0} == {"entry": 0, "size": size, "limit": 4096, "cut_bytes": 0}
    assert size - (4096 - 512) <= cut_log["cut_bytes"] <= size - len(kept.text.encode())
    assert recorded["env.run"] is not None and recorded["env.run"]["secrets"] == {"github_token": 2}
    assert recorded["leaky.rejected"] == {"entry": 1, "secrets": {"github_token": 2}}
    assert "  result guards: 2 entries (secrets redacted, sizes capped on what tools return)" in served.text()
    lines = {f["tool"]: f.get("guard") for f in fields_of(served.text(), "decision")}
    assert lines["leaky.read_config"] == "redacted:acme_key*2,aws_access_key_id*2,github_token*2"
    assert lines["leaky.dump_log"] == f"cut:{recorded['leaky.dump_log']['cut_bytes']}"

    metrics = httpx.get(served.control() + "/metrics", headers=served.control_headers(), timeout=CALL_SECONDS).text
    assert 'drawbridge_result_guard_total{action="redacted",kind="github_token"} 10.0' in metrics
    assert 'drawbridge_result_guard_total{action="truncated",kind="size"} 2.0' in metrics
    served.process.terminate()
    served.process.wait(scaled(10))
    _no_secret_anywhere(tmp_path / "evidence", tmp_path / "state.db", logs=served.text())


# -------------------------------------------------------------------------------------- wrap


async def test_wrap_guards_results_with_the_same_entries_and_refuses_when_told(tmp_path: Path) -> None:
    file = tmp_path / "guards.yaml"
    file.write_text(
        "- tools: [account]\n  redact_secrets: true\n  on_secret: refuse\n"
        "- tools: ['*']\n  redact_secrets: true\n  max_bytes: 2048\n  on_oversize: refuse\n", encoding="utf-8",
    )
    evidence = tmp_path / "evidence"
    params = wrap_params(LEAKY, "--allow-all", "--evidence-dir", str(evidence), "--result-guards", str(file))
    async with connect(params) as client:
        with anyio.fail_after(CALL_SECONDS):
            config = await client.call_tool("read_config", {})
            account = await client.call_tool("account", {})
            log = await client.call_tool("dump_log", {"kib": 2})
            small = await client.call_tool("dump_log", {"kib": 0})
    assert "[drawbridge: redacted github_token]" in _texts(config) and not config.is_error
    assert account.is_error and account.structured_content is None
    assert _texts(account) == "the result was withheld: it held a secret (github_token); result_guards entry 0 refuses such results"
    # the JSON of 2 KiB of text, and the same text again in the SDK's structured output {"result": ...}
    assert log.is_error and _texts(log) == "the result was withheld: it is 4185 bytes, over the limit of 2048 bytes (result_guards entry 1)"
    assert not small.is_error and _texts(small) == ""
    guarded = [d.get("result_guard") for d in decisions(evidence)]
    assert guarded == [{"entry": 1, "secrets": {"aws_access_key_id": 2, "github_token": 2}},
                       {"entry": 0, "secrets": {"github_token": 4}, "refused": "secret"},
                       {"entry": 1, "refused": "size", "size": 4185, "limit": 2048, "cut_bytes": 0}, None]
    _no_secret_anywhere(evidence, logs="")


async def test_a_guarded_tool_is_not_run_as_a_task_and_wrap_without_guards_relays_raw(tmp_path: Path) -> None:
    file = tmp_path / "guards.yaml"
    file.write_text("- tools: [read_config]\n  redact_secrets: true\n", encoding="utf-8")
    log = tmp_path / "wrap.log"
    with log.open("wb") as stderr:
        process = await anyio.open_process(
            wrap_argv(LEAKY, "--allow-all", "-v", "--result-guards", str(file)), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=stderr, env=child_env(),
        )
        pipe = RawPipe(process)
        try:
            await pipe.initialize()
            task = await pipe.request(2, "tools/call", {"name": "read_config", "arguments": {}, "task": {"ttl": 60000}})
            plain = await pipe.request(3, "tools/call", {"name": "account", "arguments": {}})
            guarded = await pipe.request(4, "tools/call", {"name": "read_config", "arguments": {}})
        finally:
            assert process.stdin is not None
            await process.stdin.aclose()
            with anyio.fail_after(scaled(10)):
                await process.wait()
    assert task["error"]["code"] == -32602 and "result_guards entry 0" in task["error"]["message"]
    assert "call it without 'task'" in task["error"]["message"]
    assert GITHUB_TOKEN in json.dumps(plain)  # a tool no entry names passes as it came
    assert "[drawbridge: redacted github_token]" in json.dumps(guarded)
    lines = {(f["tool"], f["outcome"]): f.get("guard") for f in fields_of(log.read_text(encoding="utf-8"), "decision")}
    assert lines == {("read_config", "invalid"): None, ("account", "ok"): None,
                     ("read_config", "ok"): "redacted:aws_access_key_id*2,github_token*2"}


def _answer(response: httpx.Response) -> dict[str, Any]:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        (data,) = [line[5:] for line in response.text.splitlines() if line.startswith("data:") and line[5:].strip()]
        return json.loads(data)
    return response.json()


async def test_serve_refuses_a_task_call_to_a_guarded_tool_and_no_task_is_created(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.log"
    tasks.touch()
    upstream = {"name": "tasking", "transport": "stdio", "command": PYTHON, "args": [str(SERVERS / "tasking.py")],
                "env": {"TASKING_LOG": str(tasks), "TASKING_RELEASE": str(tmp_path / "release")}}
    config = write_config(tmp_path, [upstream], auth={"anonymous_agent": "guest"}, evidence_dir=str(tmp_path / "evidence"),
                          result_guards=[{"tools": ["tasking.brew"], "redact_secrets": True}])
    with http_gateway(config) as running:
        assert running.url is not None
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        with httpx.Client(timeout=CALL_SECONDS) as http:
            opened = http.post(running.url, headers=headers, json=initialize_request())
            headers.update({"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": LEGACY_VERSION})
            http.post(running.url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
            params = {"name": "tasking.brew", "arguments": {"what": "tea"}, "task": {"ttl": 60000}}
            refused = _answer(http.post(running.url, headers=headers,
                                        json={"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params}))
            params["name"] = "tasking.steep"  # no entry names it: its task is created as before
            created = _answer(http.post(running.url, headers=headers,
                                        json={"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": params}))
    assert refused["error"]["code"] == -32602 and "result_guards entry 0" in refused["error"]["message"]
    assert "task" in created["result"] and tasks.read_text(encoding="utf-8").split()[1::2] == ["steep"]
    (brew,) = decisions(tmp_path / "evidence", "tasking.brew")
    assert brew["outcome"] == "invalid" and brew["action"] == "allow"


async def test_an_openapi_upstream_s_answers_are_guarded_the_same_way(tmp_path: Path) -> None:
    with openapi_backend() as backend:
        config = write_config(tmp_path, [], openapi=[items_entry(backend)], evidence_dir=str(tmp_path / "evidence"),
                              auth={"anonymous_agent": "guest"},
                              result_guards=[{"tools": ["items.*"], "redact_secrets": True, "max_bytes": 1024}])
        with http_gateway(config) as running:
            assert running.url is not None
            async with http_client(running.url) as client:
                with anyio.fail_after(CALL_SECONDS):
                    echoed = await client.call_tool("items.get_echo", {"text": GITHUB_TOKEN})
                    big = await client.call_tool("items.get_big", {})
    assert "/api/echo/[drawbridge: redacted github_token]" in _texts(echoed) and GITHUB_TOKEN not in _texts(echoed)
    assert _texts(big).endswith("[drawbridge: result cut at 1024 bytes (result_guards); 2543 more bytes were not shown]")
    assert len(_texts(big).split("\n")[0].encode()) <= 1024
    recorded = {d["tool"]: d.get("result_guard") for d in decisions(tmp_path / "evidence")}
    assert recorded == {"items.get_echo": {"entry": 0, "secrets": {"github_token": 2}},  # text and structured
                        "items.get_big": {"entry": 0, "size": 3055, "limit": 1024, "cut_bytes": 2543}}


# ------------------------------------------------------------------------- hostile answers


def _call() -> Any:
    from drawbridge.gateway.pipeline.tool_call import ToolCall

    return ToolCall(agent="a", tool="t", arguments={}, meta=None, request_id=1)


def test_an_input_required_result_is_redacted_and_a_secret_in_its_request_state_withholds_it() -> None:
    """The agent reads inputRequests (redacted); requestState goes back to the upstream as it came, so a
    secret in it withholds the whole answer rather than alter it."""
    asked = {"resultType": "input_required", "requestState": "opaque-1",
             "inputRequests": {"r1": {"method": "elicitation/create", "params": {"message": f"paste {GITHUB_TOKEN}"}}}}
    guarded = guards(redact_secrets=True).answer(_call(), {"jsonrpc": "2.0", "id": 1, "result": asked})
    assert guarded is not None
    body, report = guarded
    assert body["result"]["inputRequests"]["r1"]["params"]["message"] == "paste [drawbridge: redacted github_token]"
    assert body["result"]["requestState"] == "opaque-1" and body["result"]["resultType"] == "input_required"
    leaky_state = {**asked, "requestState": GITHUB_TOKEN}
    withheld = guards(redact_secrets=True).answer(_call(), {"jsonrpc": "2.0", "id": 1, "result": leaky_state})
    assert withheld is not None
    body, report = withheld
    assert body["result"]["isError"] is True and body["result"]["resultType"] == "complete"
    assert GITHUB_TOKEN not in json.dumps(body) and report.refused == "secret"
    refused = guards(redact_secrets=True, on_secret="refuse").answer(_call(), {"jsonrpc": "2.0", "id": 1, "result": asked})
    assert refused is not None and refused[0]["result"]["resultType"] == "complete" and GITHUB_TOKEN not in json.dumps(refused[0])


def test_an_error_that_is_not_an_object_never_passes_raw_and_a_refused_error_has_a_code() -> None:
    for error in (f"bad {GITHUB_TOKEN}", [GITHUB_TOKEN], None, 3):
        guarded = guards(max_bytes=4096).answer(_call(), {"jsonrpc": "2.0", "id": 1, "error": error})
        assert guarded is not None
        body, report = guarded
        assert body["error"]["code"] == -32603 and GITHUB_TOKEN not in json.dumps(body)
        assert report.log_field() == "refused:malformed"
    refused = guards(redact_secrets=True, on_secret="refuse").answer(
        _call(), {"jsonrpc": "2.0", "id": 1, "error": {"message": f"bad {GITHUB_TOKEN}"}})
    assert refused is not None and refused[0]["error"]["code"] == -32603


async def test_a_large_hostile_result_is_guarded_in_bounded_time_and_off_the_event_loop(tmp_path: Path) -> None:
    """4 MB of private key BEGIN lines (each once made the detector rescan the rest of the text) and of
    plain filler are guarded within a few times what relaying 4 MB unguarded costs; and while a result is
    being scanned at length (an operator's pattern that costs its bound at every position), calls to
    another tool are answered promptly."""
    file = tmp_path / "guards.yaml"
    file.write_text(
        "- tools: [flood]\n  redact_secrets: true\n"
        "- tools: [pages]\n  secret_patterns:\n    slow: '[\\s\\S]{1,255}Q'\n", encoding="utf-8",
    )
    params = wrap_params(LEAKY, "--allow-all", "--result-guards", str(file))
    latencies: list[float] = []
    async with connect(params) as client:
        with anyio.fail_after(CALL_SECONDS * 2):
            await client.call_tool("plain", {"kib": 1})
            started = time.monotonic()
            await client.call_tool("plain", {"kib": 4096})
            plain_seconds = time.monotonic() - started
            for kind in ("headers", "filler"):
                started = time.monotonic()
                flooded = await client.call_tool("flood", {"kind": kind, "kib": 4096})
                assert time.monotonic() - started < 4 * plain_seconds + scaled(1.0), kind
                assert ("redacted pem_private_key" in _texts(flooded)) == (kind == "headers")

            done = anyio.Event()
            items = 0

            async def scanned_at_length() -> None:
                await client.call_tool("pages", {"kib": 2048, "items": items})
                done.set()

            for items in (2048, 1):  # many strings, and one long one
                done = anyio.Event()
                latencies.clear()
                started = time.monotonic()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(scanned_at_length)
                    while not done.is_set():
                        asked = time.monotonic()
                        await client.call_tool("plain", {"kib": 0})
                        latencies.append(time.monotonic() - asked)
                scan_seconds = time.monotonic() - started
                assert len(latencies) >= 3 and max(latencies) < scan_seconds / 3, (items, scan_seconds, latencies)


def test_a_private_key_written_with_escaped_newlines_and_cut_short_is_redacted_whole() -> None:
    """As in a service account's JSON: the body after the header is taken, escapes and all."""
    body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC\\nBKcwggSjAgEAAoIBAQC7\\r\\n q2w3e4r5t6y7"
    guarded = guards(redact_secrets=True).apply("a", "t", text_result(f'{{"private_key": "-----BEGIN PRIVATE KEY-----\\n{body}"}}'))
    assert guarded is not None
    assert guarded[0]["content"][0]["text"] == '{"private_key": "[drawbridge: redacted pem_private_key]"}'


PEM_LINES = ["-----BEGIN RSA PRIVATE KEY-----", "MIIEowIBAAKCAQEA7Vx1q2w3e4r5t6y7", "u8i9o0p1a2s3d4f5g6h7", "-----END RSA PRIVATE KEY-----"]


def test_an_upstream_s_stderr_hides_a_key_block_s_body_lines_and_a_token_at_the_cut(caplog: pytest.LogCaptureFixture) -> None:
    """serve relays an upstream's stderr line by line: the body lines after a BEGIN line are hidden up
    to the END line, and a long line is cut after it was redacted (a token at the cut is not half shown)."""
    import os
    import threading

    from drawbridge.gateway.upstreams.child_process import STDERR_LINE_CAP, relay_stderr

    read, write = os.pipe()
    caplog.set_level("INFO")
    relay_stderr(read, "noisy")
    (relay,) = [thread for thread in threading.enumerate() if thread.name == "drawbridge-stderr-noisy"]
    at_cut = "x" * (STDERR_LINE_CAP - 10) + " " + GITHUB_TOKEN
    os.write(write, "\n".join(["starting", *PEM_LINES, "after the key", at_cut, ""]).encode())
    os.close(write)
    relay.join(scaled(10.0))
    lines = [record.activity["line"] for record in caplog.records if getattr(record, "activity", {}).get("event") == "upstream_stderr"]
    assert lines[0] == "starting" and lines[-2] == "after the key"
    assert all("[drawbridge: redacted pem_private_key]" in line for line in lines[1:5])
    assert not [line for line in lines if "MIIE" in line or "u8i9" in line or GITHUB_TOKEN[:8] in line], lines


def test_a_key_split_over_the_strings_of_a_list_is_redacted_whole() -> None:
    result = {"content": [], "structuredContent": {"lines": ["config:", *PEM_LINES, "done"]}}
    guarded = guards(redact_secrets=True).apply("a", "t", result)
    assert guarded is not None
    lines = guarded[0]["structuredContent"]["lines"]
    assert lines[0] == "config:" and lines[-1] == "done"
    assert set(lines[1:5]) == {"[drawbridge: redacted pem_private_key]"}
    items = guards(redact_secrets=True).apply("a", "t", {"content": [{"type": "text", "text": line} for line in ["config:", *PEM_LINES, "done"]]})
    assert items is not None
    assert [item["text"] for item in items[0]["content"]] == ["config:", *["[drawbridge: redacted pem_private_key]"] * 4, "done"]


def test_two_secrets_used_as_keys_stay_two_keys() -> None:
    other = "ghp_" + "Z" * 36
    guarded = guards(redact_secrets=True).apply("a", "t", {"content": [], "structuredContent": {GITHUB_TOKEN: "first", other: "second"}})
    assert guarded is not None
    assert guarded[0]["structuredContent"] == {"[drawbridge: redacted github_token]": "first",
                                               "[drawbridge: redacted github_token #2]": "second"}


@pytest.mark.parametrize("result", [
    {"content": [{"type": "text", "text": ""}] * 100_000},
    {"content": [{"type": "text", "text": "éé"}] * 769},
    {"content": [{"type": "text", "text": "a", "_meta": {"k": "m" * 50_000}}], "_meta": {"k": "m" * 50_000}},
    {"content": [{"type": "resource", "resource": {"uri": "file:///" + "u" * 100_000, "text": "t"}}]},
    {"content": [{"type": "image", "data": "QQ==", "mimeType": "image/png", "_meta": {"k": "m" * 9000}},
                 {"type": "text", "text": "x", "annotations": {"audience": ["user"] * 3000}}], "extra": "e" * 9000},
    {"content": [{"type": "text", "text": "\u0001\"\\" * 5000}]},
])
def test_the_size_limit_holds_the_result_s_whole_json(result: dict[str, Any]) -> None:
    """What a result carries besides its text (``_meta``, annotations, other members, a resource's URI,
    the braces of empty items, JSON escapes) counts, and a cut result's JSON stays within the limit."""
    guarded = guards(max_bytes=2048).apply("a", "t", result)
    assert guarded is not None
    out, report = guarded
    assert len(json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode()) <= 2048
    assert report.size == len(json.dumps(result, ensure_ascii=False, separators=(",", ":")).encode())
    assert out["content"][-1]["text"].startswith("[drawbridge: result cut at 2048 bytes (result_guards)")


def test_an_operator_s_pattern_searched_by_windows_finds_a_secret_across_a_window_s_edge() -> None:
    acme = Detector("acme_key", check_secret_regex("ACME-[0-9a-f]{32}"), windowed=True)
    for at in (65536 - 20, 65536, 2 * 65536 - 1):
        text = "x" * at + ACME_KEY + " " + ACME_KEY + "y" * 70_000
        guarded = guards(secret_patterns=(acme,)).apply("a", "t", text_result(text))
        assert guarded is not None and guarded[1].secrets == (("acme_key", 2),), at
        assert guarded[0]["content"][0]["text"] == "x" * at + "[drawbridge: redacted acme_key] [drawbridge: redacted acme_key]" + "y" * 70_000


def test_an_input_required_result_over_the_limit_is_withheld_not_cut() -> None:
    asked = {"resultType": "input_required", "requestState": "s" * 5000,
             "inputRequests": {"r1": {"method": "elicitation/create", "params": {"message": "more?"}}}}
    guarded = guards(max_bytes=2048).apply("a", "t", asked)
    assert guarded is not None and guarded[1].refused == "size"
    assert guarded[0]["resultType"] == "complete" and guarded[0]["isError"] is True


async def test_a_call_whose_result_is_scanned_longer_than_the_call_timeout_times_out(tmp_path: Path) -> None:
    """The scan runs on a worker thread: the call's timeout still fires, and the scan's end is ignored."""
    file = tmp_path / "guards.yaml"
    file.write_text("- tools: [pages]\n  secret_patterns:\n    slow: '[\\s\\S]{1,255}Q'\n", encoding="utf-8")
    params = wrap_params(LEAKY, "--allow-all", "--result-guards", str(file), "--call-timeout", "1")
    async with connect(params) as client:
        with anyio.fail_after(CALL_SECONDS):
            with pytest.raises(MCPError) as timed_out:
                await client.call_tool("pages", {"kib": 8192, "items": 8192})
            assert timed_out.value.error.code == -32001
            assert not (await client.call_tool("plain", {"kib": 0})).is_error
