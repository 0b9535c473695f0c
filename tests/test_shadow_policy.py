"""The shadow policy (``--shadow-policy``, ``shadow_policy_dir``/``shadow_policy_file``): decided beside the
enforced policy on every call the policy decides, reported on the decision line, at ``GET /shadow``, by
``drawbridge policy shadow`` and in ``/metrics``, and never enforced: the call goes as the enforced
policy says, and the evidence (trace, surface records, truth carriers) is the same with or without it.

The gateways are real ``drawbridge wrap`` and ``drawbridge serve`` processes in front of the github_like
fixture server; the units below them are the decider, the floors, the tally and the metrics.
"""

from __future__ import annotations

import json
import logging
import shlex
import subprocess
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from approval_support import ControlPlane, cli
from conftest import GITHUB_LIKE, PYTHON, child_env, connect, eventually_async, scaled, wrap_params
from mcp.client.stdio import stdio_client
from prometheus_client.parser import text_string_to_metric_families
from serve_support import GITHUB, background, free_port, http_client, http_gateway, serve_argv, sha256, write_config

from drawbridge.catalogue.floors import Floor
from drawbridge.config import ConfigError, parse_config
from drawbridge.gateway.pipeline.deciders import PolicyDecider
from drawbridge.gateway.pipeline.floors import floored_verdict
from drawbridge.gateway.pipeline.outcomes import Outcome
from drawbridge.gateway.pipeline.records import CallRecord
from drawbridge.gateway.pipeline.shadow import ShadowVerdict
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.gateway.pipeline.verdicts import Provenance
from drawbridge.gateway.recording.metrics import GatewayMetrics
from drawbridge.gateway.recording.shadow_tally import ShadowTally
from drawbridge.policy.model import Action
from drawbridge.state.policy_store import PolicyStore

ENFORCED = """\
name: enforced
agent: "*"
rules:
  - tools: ["list_repos", "get_repo"]
    action: allow
  - tools: ["add_deploy_key"]
    action: human_approval
  - tools: ["*"]
    action: deny
"""
SHADOW = """\
name: candidate
agent: "*"
rules:
  - tools: ["list_repos"]
    action: deny
  - tools: ["get_repo"]
    action: human_approval
  - tools: ["delete_repo", "add_deploy_key"]
    action: allow
"""
TRUTH_ENV = {"DRAWBRIDGE_TDT_HMAC_KEY": "shadow-truth-key-0123456789abcdef01", "DRAWBRIDGE_TDT_HMAC_KEY_ID": "kid-shadow"}
SECRET = "argument-value-never-shown-7c1d"
DECISION = "drawbridge: INFO decision "
LINE_WAIT = scaled(20.0)


def _policies(tmp_path: Path, shadow: str = SHADOW) -> tuple[Path, Path]:
    enforced, candidate = tmp_path / "enforced.yaml", tmp_path / "shadow.yaml"
    enforced.write_text(ENFORCED, encoding="utf-8")
    candidate.write_text(shadow, encoding="utf-8")
    return enforced, candidate


def _decisions(text: str) -> list[dict[str, str]]:
    """The ``key=value`` fields of each decision line of a gateway's text log."""
    return [dict(pair.split("=", 1) for pair in shlex.split(line[len(DECISION):]))
            for line in text.splitlines() if line.startswith(DECISION)]


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _call(tool: str = "list_repos", agent: str = "tester") -> ToolCall:
    return ToolCall(agent, tool, {"owner": SECRET}, None, 1)


# ------------------------------------------------------------------------------------------ units


class _RaisingStore(PolicyStore):
    """A shadow set whose evaluation fails (as a bug in a condition would), quoting an argument."""

    def decide(self, agent: str, tool: str, arguments: Any = None) -> Any:
        raise RuntimeError(f"cannot compare {SECRET}")


def test_a_shadow_that_raises_leaves_the_enforced_verdict(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    enforced, candidate = _policies(tmp_path)
    alone = PolicyDecider(PolicyStore.open(enforced)).decide_now(_call())
    with caplog.at_level(logging.WARNING, logger="drawbridge.gateway"):
        verdict = PolicyDecider(PolicyStore.open(enforced), _RaisingStore.open(candidate)).decide_now(_call())
    assert (verdict.action, verdict.reason, verdict.provenance) == (alone.action, alone.reason, alone.provenance)
    assert verdict.action is Action.ALLOW
    assert verdict.provenance.shadow == ShadowVerdict(None, "failed", Action.ALLOW)
    assert verdict.provenance.shadow.differs and verdict.provenance.shadow.shown == "failed"
    assert "the shadow policy raised RuntimeError" in caplog.text and SECRET not in caplog.text


def test_the_shadow_is_decided_beside_and_kept_by_a_floor(tmp_path: Path) -> None:
    enforced, candidate = _policies(tmp_path)
    verdict = PolicyDecider(PolicyStore.open(enforced), PolicyStore.open(candidate)).decide_now(_call())
    assert verdict.action is Action.ALLOW
    assert verdict.provenance.shadow == ShadowVerdict(Action.DENY, "shadow.yaml:4", Action.ALLOW)
    floored = floored_verdict(verdict, Floor(Action.DENY, ("a new tool",)), "list_repos")
    assert floored.action is Action.DENY and floored.provenance.policy == "drawbridge"
    # The floor decided; the shadow still compares with what the enforced policy said (allow).
    assert floored.provenance.shadow == verdict.provenance.shadow


def _record(tool: str, shadow: ShadowVerdict | None, agent: str = "tester", outcome: Outcome = Outcome.OK) -> CallRecord:
    provenance = Provenance("enforced", "enforced.yaml", 0, shadow=shadow)
    return CallRecord(agent, 1, tool, Action.ALLOW, "ok", provenance, outcome, None, None, 1.0, 2.0, None)


def test_a_pending_approval_counts_once_its_retry_is_recorded(tmp_path: Path) -> None:
    """A non-blocking or 2026-07-28 approval is recorded twice, pending then settled: one count."""
    enforced, _ = _policies(tmp_path)
    tally, metrics = ShadowTally(PolicyStore.open(enforced)), GatewayMetrics()
    metrics.shadow_calls = {}
    asked = ShadowVerdict(Action.DENY, "shadow.yaml:4", Action.HUMAN_APPROVAL)
    for outcome in (Outcome.APPROVAL_PENDING, Outcome.OK):
        record = _record("add_deploy_key", asked, outcome=outcome)
        tally.observe(record)
        metrics.observe(record)
    assert (tally.report()["calls"], tally.report()["differing"]) == (1, 1)
    assert metrics.shadow_calls == {("human_approval", "deny"): 1}


def test_a_table_title_is_shown_as_written_never_as_markup() -> None:
    """A shadow path such as ``cand[v2]`` is a title: rich must not read it as a style (or fail on ``[/]``)."""
    from rich.console import Console

    from drawbridge.cli.output import key_values, table

    for title in ("shadow policy cand[v2] (generation 0)", "agent [/] tool"):
        out = Console(width=200, record=True)
        out.print(table(title, ["A"], [["x"]]))
        out.print(key_values(title, [("k", "v")]))
        shown = "".join(out.export_text().split())  # a title wraps to its table's width
        assert shown.count("".join(title.split())) == 2


def test_the_tally_counts_each_record_differing_first_within_its_bound(tmp_path: Path) -> None:
    enforced, _ = _policies(tmp_path)
    tally = ShadowTally(PolicyStore.open(enforced), max_rows=2)
    agree = ShadowVerdict(Action.ALLOW, "shadow.yaml:8", Action.ALLOW)
    deny = ShadowVerdict(Action.DENY, "shadow.yaml:4", Action.ALLOW)
    for record in (_record("get_repo", agree), _record("get_repo", agree), _record("list_repos", deny),
                   _record("list_repos", None), _record("delete_repo", deny), _record("create_issue", agree)):
        tally.observe(record)
    report = tally.report()
    assert (report["calls"], report["differing"]) == (5, 2)
    assert report["rows"] == [
        {"agent": "tester", "tool": "list_repos", "action": "allow", "shadow_action": "deny", "differs": True, "calls": 1},
        {"agent": "tester", "tool": "get_repo", "action": "allow", "shadow_action": "allow", "differs": False, "calls": 2},
        {"overflow": True, "calls": 2, "differing": 1},
    ]
    assert report["shadow_policy"]["files"].keys() == {"enforced.yaml"}
    assert report["shadow_policy"]["last_error"] is None and report["shadow_policy"]["generation"] == 0


def test_the_metrics_count_shadow_pairs_only_with_a_shadow() -> None:
    metrics = GatewayMetrics()
    record = _record("list_repos", ShadowVerdict(Action.DENY, "shadow.yaml:4", Action.ALLOW), agent="alice")
    metrics.observe(record)
    assert "drawbridge_shadow_calls" not in metrics.exposition()[0].decode()
    metrics.shadow_calls = {}
    metrics.observe(record)
    metrics.observe(_record("list_repos", ShadowVerdict(None, "failed", Action.ALLOW)))
    text = metrics.exposition()[0].decode()
    samples = _samples(text)
    assert samples[("drawbridge_shadow_calls_total", (("action", "allow"), ("shadow_action", "deny")))] == 1
    assert samples[("drawbridge_shadow_calls_total", (("action", "allow"), ("shadow_action", "failed")))] == 1
    assert "alice" not in text and "list_repos" not in text


def test_serve_reads_both_shadow_keys_relative_to_the_file_and_refuses_both_at_once(tmp_path: Path) -> None:
    source, top = str(tmp_path / "drawbridge.yaml"), "upstreams: [{name: a, transport: stdio, command: a}]\npolicy_dir: ./p\n"
    directory = parse_config(top + "shadow_policy_dir: ./candidate\n", source)
    assert directory.shadow_policy_dir == str(tmp_path / "candidate") and directory.shadow_policy_file is None
    single = parse_config(top + "shadow_policy_file: cand.yaml\n", source)
    assert single.shadow_policy_file == str(tmp_path / "cand.yaml") and single.shadow_policy_dir is None
    assert parse_config(top, source).shadow_policy_dir is None
    with pytest.raises(ConfigError, match=r"drawbridge.yaml:4: set shadow_policy_dir or shadow_policy_file, not both"):
        parse_config(top + "shadow_policy_dir: ./c\nshadow_policy_file: c.yaml\n", source)


# ------------------------------------------------------------------------------------ wrap, live


def _wrap_flags(enforced: Path, evidence: Path, port: int, *extra: str) -> list[str]:
    return ["--policy", str(enforced), "--agent", "tester", "--evidence-dir", str(evidence), "--fsync", "never",
            "--tool-decision-truth-out", str(evidence.parent / f"{evidence.name}-truth.ndjson"),
            "--control-port", str(port), "--verbose", *extra]


async def _same_calls(client: Any, control: ControlPlane, *, approve: bool) -> None:
    """An allowed call the shadow denies, an allowed one the shadow would ask a person for (never
    waited for), a denied one the shadow allows, and (``approve``) one a person approves."""
    assert not (await client.call_tool("list_repos", {"owner": SECRET})).is_error
    with anyio.fail_after(scaled(10)):
        assert not (await client.call_tool("get_repo", {"owner": "acme", "name": "rocket"})).is_error
    refused = await client.call_tool("delete_repo", {"owner": "acme", "name": SECRET})
    assert refused.is_error and "candidate" not in str(refused.content)

    async def pending() -> tuple[list[dict[str, Any]]]:
        return (await control.pending(),)

    assert await eventually_async(pending, scaled(15), "the control plane", ignoring=(httpx.HTTPError, OSError)) == ([],)
    if not approve:
        return
    results: list[Any] = []

    async def deploy_key() -> None:
        arguments = {"owner": "acme", "repo": "rocket", "title": "t", "key": "k"}
        results.append(await client.call_tool("add_deploy_key", arguments))

    async with anyio.create_task_group() as tg:
        tg.start_soon(deploy_key)
        (waiting,) = await control.wait_pending()
        assert waiting["tool"] == "add_deploy_key"
        assert (await control.approve(waiting["id"])).status_code == 200
    assert not results[0].is_error


@pytest.mark.anyio
async def test_wrap_reports_the_shadow_and_enforces_only_the_policy(tmp_path: Path) -> None:
    enforced, candidate = _policies(tmp_path)
    evidence, port = tmp_path / "evidence", free_port()
    control = ControlPlane(port, evidence)
    params = wrap_params(GITHUB_LIKE, *_wrap_flags(enforced, evidence, port, "--shadow-policy", str(candidate)),
                         env=TRUTH_ENV)
    log = tmp_path / "gateway.stderr"
    with log.open("w", encoding="utf-8") as errlog:
        async with connect(stdio_client(params, errlog=errlog)) as client:  # type: ignore[arg-type]
            await _same_calls(client, control, approve=True)
            await eventually_async(lambda: len(_decisions(log.read_text())) >= 4, LINE_WAIT, "four decision lines")
            report = await control.get("/shadow")
            async with httpx.AsyncClient(trust_env=False, timeout=scaled(10)) as http:
                metrics = (await http.get(control.url + "/metrics", headers=control.headers())).text
            table = cli("policy", "shadow", *control.cli_args())
            as_json = cli("policy", "shadow", *control.cli_args(), "--format", "json")
    lines = {line["tool"]: line for line in _decisions(log.read_text())}
    assert {tool: (line["action"], line["shadow"], line["shadow_rule"], line["shadow_differs"])
            for tool, line in lines.items()} == {
        "list_repos": ("allow", "deny", "shadow.yaml:4", "true"),
        "get_repo": ("allow", "human_approval", "shadow.yaml:6", "true"),
        "delete_repo": ("deny", "allow", "shadow.yaml:8", "true"),
        "add_deploy_key": ("allow", "allow", "shadow.yaml:8", "true"),
    }
    assert lines["add_deploy_key"]["approval"] and lines["list_repos"]["outcome"] == "ok"
    # Once per recorded call: the approved call was decided twice (asked, then again after the
    # approval) and is one call; it differs, as the enforced policy asked a person and the shadow not.
    assert (report["calls"], report["differing"]) == (4, 4)
    rows = {row["tool"]: row for row in report["rows"]}
    assert rows["add_deploy_key"] == {"agent": "tester", "tool": "add_deploy_key", "action": "human_approval",
                                      "shadow_action": "allow", "differs": True, "calls": 1}
    assert report["shadow_policy"]["path"] == str(candidate)
    assert report["shadow_policy"]["files"].keys() == {"shadow.yaml"} and report["shadow_policy"]["last_error"] is None
    samples = _samples(metrics)
    for action, shadow in (("allow", "deny"), ("allow", "human_approval"), ("deny", "allow"), ("human_approval", "allow")):
        assert samples[("drawbridge_shadow_calls_total", (("action", action), ("shadow_action", shadow)))] == 1
    assert table.returncode == 0, table.stderr
    assert "4 calls, 4 differing" in table.stdout and "add_deploy_key" in table.stdout
    assert json.loads(as_json.stdout)["rows"] == report["rows"]
    assert SECRET not in log.read_text() + table.stdout + json.dumps(report)


VARYING = frozenset({"at", "entry_hash", "prev_hash", "origin", "run_id", "latency_ms", "decision_ms"})
"""What differs between any two runs (times, the chain's hashes, the run's names), shadow or not."""


def _steady(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _steady(item) for key, item in value.items() if key not in VARYING}
    if isinstance(value, list):
        return [_steady(item) for item in value]
    return value


def _evidence(evidence: Path) -> dict[str, Any]:
    read = lambda path: [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]  # noqa: E731
    return {
        "trace": _steady(read(evidence / "trace.ndjson")),
        "surface": (evidence / "tool-decisions.ndjson").read_bytes(),
        "truth": _steady(read(evidence.parent / f"{evidence.name}-truth.ndjson")),
    }


@pytest.mark.anyio
async def test_the_evidence_is_the_same_with_and_without_a_shadow(tmp_path: Path) -> None:
    enforced, candidate = _policies(tmp_path)
    runs = {}
    for name, extra in (("plain", ()), ("shadowed", ("--shadow-policy", str(candidate)))):
        evidence, port = tmp_path / name, free_port()
        control = ControlPlane(port, evidence)
        params = wrap_params(GITHUB_LIKE, *_wrap_flags(enforced, evidence, port, *extra), env=TRUTH_ENV)
        async with connect(params) as client:
            await _same_calls(client, control, approve=False)
            if name == "plain":
                async with httpx.AsyncClient(trust_env=False, timeout=scaled(10)) as http:
                    missing = await http.get(control.url + "/shadow", headers=control.headers())
                refused = cli("policy", "shadow", *control.cli_args())
        runs[name] = _evidence(evidence)
    assert missing.status_code == 404 and missing.json() == {"error": "no shadow policy is configured"}
    assert refused.returncode == 1 and "no shadow policy is configured" in refused.stderr
    plain, shadowed = runs["plain"], runs["shadowed"]
    assert len(plain["trace"]) == 6 and len(plain["truth"]) == 3  # run_start, policy set, 3 calls, run_end
    assert shadowed == plain
    assert b"candidate" not in shadowed["surface"] and "candidate" not in json.dumps(shadowed["trace"])


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--shadow-policy", "{shadow}"], "--shadow-policy needs --policy"),
        (["--allow-all", "--shadow-policy", "{shadow}"], "--shadow-policy and --allow-all exclude each other"),
    ],
)
def test_a_shadow_needs_an_enforced_policy(tmp_path: Path, flags: list[str], problem: str) -> None:
    _, candidate = _policies(tmp_path)
    argv = [PYTHON, "-m", "drawbridge", "wrap", *(f.format(shadow=candidate) for f in flags), "--", *GITHUB_LIKE]
    done = subprocess.run(argv, capture_output=True, text=True, env=child_env(), timeout=scaled(30),
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and problem in done.stderr and done.stdout == ""


def test_a_shadow_that_does_not_load_is_one_line_and_exit_2(tmp_path: Path) -> None:
    enforced, candidate = _policies(tmp_path, shadow=SHADOW.replace("action: deny", "action: alow"))
    done = subprocess.run(
        [PYTHON, "-m", "drawbridge", "wrap", "--policy", str(enforced), "--shadow-policy", str(candidate), "--",
         *GITHUB_LIKE], capture_output=True, text=True, env=child_env(), timeout=scaled(30), stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"drawbridge: cannot load the shadow policy {candidate}: {candidate}:5: "), line


SHADOW_RELOADED = "drawbridge: INFO shadow policy files reloaded from "
SHADOW_REFUSED = "drawbridge: WARNING shadow policy reload failed, keeping the previous policies: "


@pytest.mark.anyio
async def test_an_edited_shadow_is_reloaded_and_a_broken_edit_keeps_the_last_good_one(tmp_path: Path) -> None:
    enforced, candidate = _policies(tmp_path)
    evidence = tmp_path / "evidence"
    params = wrap_params(GITHUB_LIKE, "--policy", str(enforced), "--shadow-policy", str(candidate), "--agent",
                         "tester", "--evidence-dir", str(evidence), "--fsync", "never", "--verbose")
    log = tmp_path / "gateway.stderr"

    async def shadow_of_call(count: int) -> str:
        assert not (await client.call_tool("list_repos", {"owner": "acme"})).is_error
        lines = await eventually_async(lambda: (found := _decisions(log.read_text())) and len(found) >= count and found,
                                       LINE_WAIT, f"decision line {count}")
        return str(lines[count - 1]["shadow"])

    with log.open("w", encoding="utf-8") as errlog:
        async with connect(stdio_client(params, errlog=errlog)) as client:  # type: ignore[arg-type]
            assert await shadow_of_call(1) == "deny"
            candidate.write_text(SHADOW.replace('["list_repos"]', '["nothing"]'), encoding="utf-8")
            await eventually_async(lambda: SHADOW_RELOADED in log.read_text(), LINE_WAIT, "the shadow's reload")
            assert await shadow_of_call(2) == "deny"  # no rule matches now: the default deny
            candidate.write_text(SHADOW.replace('["list_repos"]', '["nothing"]').replace(
                '["delete_repo", "add_deploy_key"]', '["list_repos"]'), encoding="utf-8")
            await eventually_async(lambda: log.read_text().count(SHADOW_RELOADED) == 2, LINE_WAIT, "the 2nd reload")
            assert await shadow_of_call(3) == "allow"
            candidate.write_text("this: [is not a policy", encoding="utf-8")
            await eventually_async(lambda: SHADOW_REFUSED in log.read_text(), LINE_WAIT, "the refused reload")
            assert await shadow_of_call(4) == "allow"
    text = log.read_text()
    (refused,) = [line for line in text.splitlines() if line.startswith(SHADOW_REFUSED)]
    assert refused.startswith(f"{SHADOW_REFUSED}{candidate}:1: invalid YAML"), refused
    # The enforced set never changed, and the shadow's reloads are in no evidence.
    assert "policies reloaded" not in text
    assert "mesh.policy_reload" not in (evidence / "trace.ndjson").read_text()


# ------------------------------------------------------------------------------------ serve, live

ALICE = "alice-shadow-token"


def _serve_config(directory: Path, **shadow: Any) -> Path:
    enforced = "name: alice\nagent: alice\nrules:\n  - tools: ['github.list_repos']\n    action: allow\n"
    return write_config(
        directory, [GITHUB], policies={"alice.yaml": enforced},
        auth={"agents": [{"agent": "alice", "token_sha256": sha256(ALICE)}]},
        evidence_dir=str(directory / "evidence"), control={"port": 0}, **shadow,
    )


@pytest.mark.anyio
async def test_serve_decides_its_shadow_file_beside_the_policy_dir(tmp_path: Path) -> None:
    (tmp_path / "candidate.yaml").write_text(
        "name: candidate\nagent: '*'\nrules:\n  - tools: ['github.*']\n    action: human_approval\n", encoding="utf-8"
    )
    with http_gateway(_serve_config(tmp_path, shadow_policy_file="candidate.yaml")) as running:
        assert running.url is not None
        assert f"shadow policy: 1 from {tmp_path / 'candidate.yaml'} (reported, never enforced)" in running.text()
        async with http_client(running.url, "legacy", ALICE) as alice:
            with anyio.fail_after(scaled(10)):
                assert not (await alice.call_tool("github.list_repos", {"owner": SECRET})).is_error
        headers = running.control_headers()

        def shadow() -> dict[str, Any] | None:
            report = httpx.get(running.control() + "/shadow", headers=headers).json()
            return report if report["calls"] else None

        report = await eventually_async(shadow, LINE_WAIT, "the call tallied")
    assert report["rows"] == [{"agent": "alice", "tool": "github.list_repos", "action": "allow",
                               "shadow_action": "human_approval", "differs": True, "calls": 1}]
    assert report["shadow_policy"]["path"] == str(tmp_path / "candidate.yaml")


def test_serve_stops_on_a_shadow_dir_that_does_not_load(tmp_path: Path) -> None:
    shadows = tmp_path / "candidates"
    shadows.mkdir()
    (shadows / "broken.yaml").write_text("name: x\nagent: '*'\nrules: [\n", encoding="utf-8")
    config = _serve_config(tmp_path, shadow_policy_dir="candidates")
    done = subprocess.run(serve_argv(config), capture_output=True, text=True, env=child_env(), timeout=scaled(30),
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"drawbridge: cannot load the shadow policy {shadows}: {shadows / 'broken.yaml'}:"), line
