"""``drawbridge demo``: the gateway in front of a GitHub-like server, a scripted agent, offline verification.

What it shows, end to end, with real processes and pipes: the agent (the mcp
SDK's client) launches ``drawbridge wrap`` over the bundled GitHub-like MCP
server with the example policy; it makes an allowed read, a denied write, a
privileged call that the policy sends to a person (the gateway asks in-band,
through the client's elicitation, and the script's "person" approves it) and a
privileged call the policy denies; then the evidence the gateway wrote is
verified offline, as a receiver would, and every evidence file is scanned for
the secret the agent planted in its arguments.

Exit code 0 when every call was decided as the policy says and every check
passed; 1 otherwise.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import click

from drawbridge.cli.evidence_cmd import read_surface
from drawbridge.cli.output import InputError, console, display_text, plain, table, verdict
from drawbridge.evidence.trace_audit import HeldCheckpoint, audit_trace
from drawbridge.evidence.side_effect_verify import verify_side_effects
from drawbridge.evidence.truth.vectors import verify_carriers
from drawbridge.state.signing_keys import read_vkey

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PLANTED_SECRET = "ghp_demo_" + "s3cr3t" * 6
SHOWN_CHARS = 240
"""What the agent saw is shown whole up to this many characters (folded in its column), never cut mid-word
at the terminal's edge."""


@dataclass(frozen=True)
class Step:
    label: str
    tool: str
    arguments: dict[str, Any]
    expected: str  # "allowed" | "refused"


STEPS = (
    Step("allowed read", "list_repos", {"owner": "acme"}, "allowed"),
    Step("denied write", "delete_repo", {"owner": "acme", "name": "rocket"}, "refused"),
    Step(
        "privileged call, approved by a person",
        "add_deploy_key",
        {"owner": "acme", "repo": "rocket", "title": "ci", "key": "ssh-ed25519 AAAAC3Nz demo", "token": PLANTED_SECRET},
        "allowed",
    ),
    Step(
        "privileged write key (denied)",
        "add_deploy_key",
        {"owner": "acme", "repo": "rocket", "title": "ci-rw", "key": "ssh-ed25519 AAAAC3Nz demo", "read_only": False},
        "refused",
    ),
)


async def _run_agent(run_dir: Path, env: dict[str, str]) -> list[tuple[Step, bool, str]]:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    evidence = run_dir / "evidence"
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m", "drawbridge", "wrap",
            "--policy", str(EXAMPLES / "policies"),
            "--agent", "demo-agent",
            "--evidence-dir", str(evidence),
            "--tool-decision-truth-out", str(evidence / "carriers.ndjson"),
            "--", sys.executable, "-m", "drawbridge.examples.servers.github_like",
        ],
        env=env,
    )
    from mcp import types

    async def person(context: Any, request: Any) -> types.ElicitResult:
        """The person at the client: reads the gateway's question and approves."""
        return types.ElicitResult(action="accept", content={"decision": "approve", "reason": "demo: reviewed"})

    results: list[tuple[Step, bool, str]] = []
    async with Client(params, cache=None, mode="legacy", elicitation_callback=person) as client:
        for step in STEPS:
            result = await client.call_tool(step.tool, step.arguments)
            text = " ".join(getattr(block, "text", "") for block in result.content).strip()
            results.append((step, not result.is_error, text))
    return results


def _checks(run_dir: Path) -> list[tuple[str, bool, str]]:
    evidence = run_dir / "evidence"
    checks: list[tuple[str, bool, str]] = []
    trace = (evidence / "trace.ndjson").read_bytes()
    verifier = read_vkey(evidence / "keys" / "checkpoint.vkey")
    latest = HeldCheckpoint("checkpoint", (evidence / "checkpoint").read_text(encoding="utf-8"))
    audit = audit_trace(trace.splitlines(keepends=True), verifier, latest)
    checks.append(
        ("trace chain and signed checkpoint (verify-chain)", audit.ok,
         f"{audit.chain['entries']} entries, hash-linked, run sealed by a checkpoint of {verifier.name}")
    )
    surface = read_surface((evidence / "tool-decisions.ndjson").read_bytes(), "tool-decisions.ndjson")
    decisions = surface["observed_tool_decisions"]
    report = verify_side_effects(surface, [])
    classified = sum(1 for d in decisions if d["classification"] == "classified")
    checks.append(
        ("surface records (verify-side-effects)", report["ok"] and len(decisions) == len(STEPS),
         f"{len(decisions)} records, {classified} privileged, levels: "
         + ", ".join(sorted({c["level"] for c in report["calls"]})))
    )
    carriers = [json.loads(line) for line in (evidence / "carriers.ndjson").read_text(encoding="utf-8").splitlines()]
    truth = verify_carriers(carriers)
    checks.append(
        ("truth carriers (verify-tdt)", truth["ok"] and len(carriers) == len(STEPS),
         f"{len(carriers)} carriers, verdicts: " + ", ".join(c["decision_verdict"] for c in carriers))
    )
    files = [path for path in evidence.rglob("*") if path.is_file()]
    leaked = [path.name for path in files if PLANTED_SECRET.encode() in path.read_bytes()]
    approvals = [json.loads(line)["body"] for line in trace.splitlines() if b'"kind":"approval_resolved"' in line]
    checks.append(
        ("approval in the trace", len(approvals) == 1 and approvals[0].get("status") == "approved",
         ", ".join(f"{a.get('status')} via {a.get('channel')} ({a.get('strength')} strength)" for a in approvals))
    )
    checks.append(("planted secret absent from evidence", not leaked, ", ".join(leaked) or "not found in any file"))
    return checks


@click.command(name="demo", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--dir", "base_dir", type=click.Path(file_okay=False), default="drawbridge-demo", show_default=True,
    help="Where each run's evidence goes (a new timestamped folder per run).",
)
def command(base_dir: str) -> None:
    """Run the gateway demo: an agent, a policy, a GitHub-like server, evidence verified offline."""
    run_dir = Path(base_dir) / datetime.now(UTC).strftime("run-%Y%m%dT%H%M%S%fZ")
    try:
        run_dir.mkdir(parents=True, mode=0o700)
    except OSError as exc:  # an unwritable parent, a parent that is a file: one line, exit 2
        raise InputError(f"--dir {display_text(base_dir)}: cannot create {display_text(str(run_dir))}: {exc.strerror}") from None
    env = dict(os.environ)
    env["DRAWBRIDGE_TDT_HMAC_KEY"] = secrets.token_hex(32)
    env["DRAWBRIDGE_TDT_HMAC_KEY_ID"] = "demo-" + secrets.token_hex(4)
    out = console()
    results = anyio.run(_run_agent, run_dir, env)
    rows = []
    calls_ok = True
    for step, allowed, text in results:
        outcome = "allowed" if allowed else "refused"
        calls_ok &= outcome == step.expected
        rows.append([plain(step.label), plain(step.tool), verdict(outcome == step.expected, outcome, outcome),
                     plain(text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…")])
    out.print(table("Calls through the gateway (agent demo-agent)", ["call", "tool", "decision", "what the agent saw"],
                    rows))
    checks = _checks(run_dir)
    out.print(table(f"Offline verification of {run_dir / 'evidence'}", ["check", "result", "detail"],
                    [[plain(name), verdict(ok), plain(detail)] for name, ok, detail in checks]))
    ok = calls_ok and all(ok for _, ok, _ in checks)
    out.print(verdict(ok, "demo passed", "demo FAILED"))
    sys.exit(0 if ok else 1)
