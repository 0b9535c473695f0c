"""A damaged state file under a real gateway: a malformed approval row fails closed for that row alone
(the gateway starts, other approvals are asked, listed and resolved), and a state that cannot be read
at start stops serve with one line and status 2, never a traceback."""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
from pathlib import Path

import anyio
import httpx
import pytest
from approval_support import cli, text_of, trace_log_appender, write_policy
from conftest import GITHUB_LIKE, PYTHON, child_env, eventually_async, scaled
from replica_support import CALL_TIMEOUT, POLICIES, approval_id_of, recording_upstream
from serve_support import http_client, http_gateway, write_config

from drawbridge.gateway.pipeline.approvals.engine import ApprovalEngine
from drawbridge.gateway.pipeline.approvals.gate import BindingKey
from drawbridge.gateway.pipeline.deciders import STATE_UNAVAILABLE, decider_failure
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.gateway.pipeline.verdicts import Provenance, Verdict
from drawbridge.state.errors import failure_text
from drawbridge.gateway.pipeline.verdicts import Action
from drawbridge.state.sqlite import StateDB, StateUnavailable
from drawbridge.state.trace_log import TraceLog

BAD_ID = "badbadbadbadbad0"


def _insert_malformed_pending(state: Path) -> None:
    """A pending row whose created_at is not a stored timestamp (what a hand edit or a damaged value leaves)."""
    with sqlite3.connect(state) as raw:
        raw.execute(
            "INSERT INTO approvals (id, agent, tool, args_digest, reason, status, created_at, expires_at) "
            "VALUES (?, 'guest', 'rec.delete_all', 'sha256:00', 'rule 1', 'pending', 'bad', "
            "'2999-01-01T00:00:00.000000Z')",
            (BAD_ID,),
        )


def _config(tmp_path: Path) -> Path:
    return write_config(
        tmp_path, [recording_upstream(tmp_path / "calls.log")], policies=POLICIES,
        evidence_dir=str(tmp_path / "evidence"), state_path=str(tmp_path / "state.db"),
        auth={"anonymous_agent": "guest"}, approval={"timeout_seconds": 60, "non_blocking": True},
    )


@pytest.mark.anyio
async def test_a_malformed_pending_row_fails_closed_alone(tmp_path: Path) -> None:
    config = _config(tmp_path)
    with http_gateway(config) as running:
        assert running.url is not None
        _insert_malformed_pending(tmp_path / "state.db")
        async with http_client(running.url) as client, httpx.AsyncClient(
            base_url=running.control(), headers=running.control_headers(), trust_env=False
        ) as operator:
            with anyio.fail_after(CALL_TIMEOUT):
                asked = await client.call_tool("rec.delete_all", {"scope": "x"})
            approval_id = approval_id_of(text_of(asked))  # a new question is still asked
            listed = await operator.get("/approvals", params={"status": "pending"})
            assert listed.status_code == 200, listed.text
            assert [a["id"] for a in listed.json()] == [approval_id]  # the malformed row is left out
            bad = await operator.post(f"/approvals/{BAD_ID}/approve", json={"resolved_by": "op"})
            assert bad.status_code == 503 and "malformed" in bad.json()["error"], bad.text  # and never approved
            good = await operator.post(f"/approvals/{approval_id}/approve", json={"resolved_by": "op"})
            assert good.status_code == 200, good.text
        assert f"approval row '{BAD_ID}' is malformed (ValueError)" in running.text()
    with http_gateway(config) as again:  # a restart ends the malformed row with the others
        assert "Traceback" not in again.text()
    with sqlite3.connect(tmp_path / "state.db") as raw:
        (status,) = raw.execute("SELECT status FROM approvals WHERE id = ?", (BAD_ID,)).fetchone()
    assert status == "expired"


def _corrupt_approvals(state: Path) -> None:
    """Random bytes over the pages of the approvals table and of its indexes (the file still opens)."""
    with sqlite3.connect(state) as raw:
        roots = [r for (r,) in raw.execute("SELECT rootpage FROM sqlite_schema WHERE tbl_name = 'approvals'")]
        (page_size,) = raw.execute("PRAGMA page_size").fetchone()
    with open(state, "r+b") as f:
        for root in roots:
            f.seek((root - 1) * page_size)
            f.write(os.urandom(page_size))


def test_a_state_that_cannot_be_read_at_start_stops_serve_with_one_line(tmp_path: Path) -> None:
    config = _config(tmp_path)
    StateDB.open(tmp_path / "state.db").close()
    _corrupt_approvals(tmp_path / "state.db")
    result = subprocess.run(
        [PYTHON, "-m", "drawbridge", "serve", "--config", str(config), "--stdio"], input="", check=False,
        capture_output=True, text=True, env=child_env(), timeout=scaled(60),
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "recover approvals after restart" in lines[0] and "does not start without its state" in lines[0], lines


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.mark.anyio
async def test_a_failed_sweep_is_logged_with_its_cause_not_only_its_type(tmp_path: Path) -> None:
    db = StateDB.open(tmp_path / "state.db")
    log = TraceLog(tmp_path / "trace.ndjson", fsync="never")
    engine = ApprovalEngine.on_state_db(
        db, trace_log_appender(log), key_for_args_digest=BindingKey(b"k" * 32, "k1"), state_keys=[b"s" * 32]
    )
    lines = _Lines()
    logging.getLogger("drawbridge.approval").addHandler(lines)
    try:
        db.close()  # every transaction now fails: the sweep's cause must say so
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.run_sweeper, 3600.0)
            await eventually_async(lambda: lines.lines, scaled(5), "the sweep's error line")
            tg.cancel_scope.cancel()
    finally:
        logging.getLogger("drawbridge.approval").removeHandler(lines)
        log.close()
    (line,) = lines.lines
    assert line == f"approval sweep failed: state database {tmp_path / 'state.db'} is closed (expire approvals)", line


@pytest.mark.anyio
async def test_a_state_failure_while_a_call_waits_for_approval_is_logged_with_its_cause(tmp_path: Path) -> None:
    """The wait runs in a task group, so the failure arrives as an exception group: what is logged
    names the state failure inside it, and the agent is told the state is unavailable."""
    db = StateDB.open(tmp_path / "state.db")
    log = TraceLog(tmp_path / "trace.ndjson", fsync="never")
    engine = ApprovalEngine.on_state_db(
        db, trace_log_appender(log), key_for_args_digest=BindingKey(b"k" * 32, "k1"), state_keys=[b"s" * 32],
        poll_seconds=0.02,
    )
    call = ToolCall("bot", "rec.delete_all", {"what": "x"}, None, 1, None)
    needs = Verdict(Action.HUMAN_APPROVAL, "a person decides", Provenance("p", "p.yaml", 1))
    failures: list[BaseException] = []

    async def wait() -> None:
        try:
            await engine.settle(call, needs, elicitation_supported=False)
        except Exception as exc:  # noqa: BLE001 -- what the pipeline's approval stage catches
            failures.append(exc)

    try:
        with anyio.fail_after(CALL_TIMEOUT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                await eventually_async(lambda: engine.store.list("pending"), scaled(5), "a pending approval")
                db.close()  # the database goes away while the call waits
    finally:
        log.close()
    (failure,) = failures
    assert isinstance(failure, BaseExceptionGroup)  # as the waiting call's task group raises it
    text = failure_text(failure)
    assert "ExceptionGroup" not in text and text.startswith(f"state database {tmp_path / 'state.db'} is closed"), text
    assert decider_failure(failure).reason == STATE_UNAVAILABLE


def test_what_an_agent_reads_of_a_state_failure_claims_no_cause_it_does_not_know() -> None:
    refused = decider_failure(StateUnavailable("state database /srv/state.db: submit approval: database or disk is full"))
    assert refused.action is Action.DENY
    assert "could not read or write its state database" in refused.reason and "cannot reach" not in refused.reason
    assert "/srv/state.db" not in refused.reason and "disk is full" not in refused.reason  # the log has the cause


def test_a_state_that_cannot_be_read_at_start_stops_wrap_with_one_line(tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    StateDB.open(state).close()
    _corrupt_approvals(state)
    done = cli("wrap", "--policy", str(write_policy(tmp_path)), "--evidence-dir", str(tmp_path / "ev"),
               "--state", str(state), "--", *GITHUB_LIKE)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "recover approvals after restart" in lines[0], lines
