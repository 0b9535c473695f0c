"""Applying a policy edit to real files: .bak, atomic write keeping the mode, reload, restore on failure."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import threading
from pathlib import Path

import anyio
import pytest

from drawbridge.evidence.chain import verify_chain
from drawbridge.policy import Action
from drawbridge.policy.edit import EditRefused, Placement
from drawbridge.state.policy_edits import (
    LOCK_NAME,
    POLICY_EDIT_KIND,
    EditApplied,
    apply_policy_edit,
    apply_policy_edit_async,
    record_policy_edit,
)
from drawbridge.state.policy_store import PolicyStore
from drawbridge.state.trace_log import TraceLog

from conftest import PIPE_SECONDS, PYTHON, child_env

CLAUDE = """\
# Claude's policy. Owner: platform team.
#
# Every rule below was reviewed on 2026-07-01.

name: claude
agent: "claude"

rules:
  # --- reads ---------------------------------------------------------
  - tools: ["github.list_*", "github.get_*"]
    action: allow      # read-only token anyway


  # --- writes --------------------------------------------------------
  # deploy keys only on staging repositories
  - tools: ["github.add_deploy_key"]
    action: allow
    when:
      - {arg: repo, op: starts_with, value: "staging-"}

  # everything else on github needs a human
  - tools: ["github.*"]
    action: human_approval

# argument contracts
schemas:
  github.add_deploy_key:
    type: object
    required: [repo]
"""

SHARED = """\
# Shared by every agent: deny what nobody listed.
name: default
agent: "*"
rules:
  - tools: ["*"]
    action: deny
"""

DATE = "2026-07-30"


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    d = tmp_path / "policies"
    d.mkdir()
    (d / "claude.yaml").write_text(CLAUDE)
    (d / "default.yaml").write_text(SHARED)
    os.chmod(d / "claude.yaml", 0o640)
    return d


def applied(result: EditApplied | EditRefused) -> EditApplied:
    assert isinstance(result, EditApplied), result
    return result


def comment_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip().startswith("#") or line.strip() == ""]


def test_an_edit_keeps_comments_makes_a_backup_keeps_the_mode_and_is_in_force(policy_dir: Path) -> None:
    store = PolicyStore.open(policy_dir)
    path = policy_dir / "claude.yaml"
    before = store.evaluate("claude", "github.add_deploy_key", {"repo": "prod-x"})
    assert before.action is Action.HUMAN_APPROVAL

    result = applied(apply_policy_edit(store, agent="claude", tool="github.add_deploy_key", action="deny",
                                       by="marc", date=DATE))

    new = path.read_text()
    header = f"  # set from console, {DATE} by marc"
    # Before the conditional rule for the tool (and its comments): every call is denied, as reported.
    assert new == CLAUDE.replace(
        "  # --- writes", f'{header}\n  - tools: ["github.add_deploy_key"]\n    action: deny\n'
        "  # --- writes",
    )
    # Every comment and blank line of the original is still there, in order.
    assert [line for line in comment_lines(new) if line != header] == comment_lines(CLAUDE)
    assert (policy_dir / "claude.yaml.bak").read_bytes() == CLAUDE.encode()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert stat.S_IMODE((policy_dir / "claude.yaml.bak").stat().st_mode) == 0o640
    assert sorted(os.listdir(policy_dir)) == [LOCK_NAME, "claude.yaml", "claude.yaml.bak", "default.yaml"]
    # In force at once, without a restart; a fresh start agrees.
    assert store.generation == 1 and store.last_error is None
    decision = store.evaluate("claude", "github.add_deploy_key", {"repo": "prod-x"})
    assert (decision.action, decision.source_file, decision.rule_index, decision.line) == (
        Action.DENY, "claude.yaml", 1, 15,
    )
    assert store.evaluate("claude", "github.add_deploy_key", {"repo": "staging-x"}).action is Action.DENY
    assert PolicyStore.open(policy_dir).evaluate("claude", "github.add_deploy_key").action is Action.DENY
    assert (result.before_action, result.after_action) == (Action.HUMAN_APPROVAL, Action.DENY)
    assert result.plan.placement is Placement.BEFORE_CONDITIONAL
    assert result.trace_body()["before"]["conditional"] == [
        {"action": "allow", "policy": "claude", "source_file": "claude.yaml", "rule_index": 1, "line": 16,
         "conditions": [{"field": "repo", "operator": "starts_with"}]},
    ]
    assert result.trace_body()["after"]["conditional"] == []
    assert (result.path, result.backup) == (path.resolve(), (policy_dir / "claude.yaml.bak").resolve())


def test_the_next_edit_rewrites_in_place_and_the_backup_holds_the_previous_version(policy_dir: Path) -> None:
    store = PolicyStore.open(policy_dir)
    path = policy_dir / "claude.yaml"
    applied(apply_policy_edit(store, agent="claude", tool="slack.post", action="allow", by="marc", date=DATE))
    first = path.read_bytes()
    result = applied(apply_policy_edit(store, agent="claude", tool="slack.post", action="human_approval",
                                       by="eve", date=DATE))
    assert result.plan.placement is Placement.REWRITE
    assert (policy_dir / "claude.yaml.bak").read_bytes() == first
    assert path.read_bytes() == first.replace(b"by marc", b"by eve").replace(
        b'["slack.post"]\n    action: allow', b'["slack.post"]\n    action: human_approval'
    )
    assert store.evaluate("claude", "slack.post").action is Action.HUMAN_APPROVAL
    back = applied(apply_policy_edit(store, agent="claude", tool="slack.post", action="inherit", by="eve",
                                     date=DATE))
    assert path.read_text() == CLAUDE
    assert (back.before_action, back.after_action) == (Action.HUMAN_APPROVAL, Action.DENY)
    assert store.evaluate("claude", "slack.post").source_file == "default.yaml"


def test_an_edit_that_leaves_the_set_invalid_restores_the_file(policy_dir: Path) -> None:
    store = PolicyStore.open(policy_dir)
    # Someone breaks another file; the hot reload refuses it and the old set stays in force.
    broken = "name: bot\nagent: bot\nrules:\n  - tools: [a]\n    action: alow\n"
    (policy_dir / "zz-bot.yaml").write_text(broken)
    assert store.reload() is not None
    result = apply_policy_edit(store, agent="claude", tool="slack.post", action="allow", by="marc", date=DATE)
    assert isinstance(result, EditRefused) and result.status == 422
    expected = f"{policy_dir / 'zz-bot.yaml'}:5: unknown action 'alow' (allowed: allow, human_approval, deny)"
    assert result.message == (
        f"the policy set does not load with this edit, so the file was restored: {expected}"
    )
    assert result.error is not None and str(result.error) == expected
    assert (policy_dir / "claude.yaml").read_bytes() == CLAUDE.encode()
    assert stat.S_IMODE((policy_dir / "claude.yaml").stat().st_mode) == 0o640
    assert store.evaluate("claude", "slack.post").action is Action.DENY
    assert not [n for n in os.listdir(policy_dir) if n.endswith(".tmp")]


def test_a_duplicate_name_on_disk_makes_the_edit_fail_and_restores_the_file(policy_dir: Path) -> None:
    store = PolicyStore.open(policy_dir)
    (policy_dir / "claude-copy.yaml").write_text('name: claude\nagent: "claude-2"\nrules: []\n')
    result = apply_policy_edit(store, agent="claude", tool="slack.post", action="allow", by="marc", date=DATE)
    assert isinstance(result, EditRefused) and result.status == 422
    assert "duplicate policy name 'claude'" in result.message
    assert (policy_dir / "claude.yaml").read_bytes() == CLAUDE.encode()
    assert store.generation == 0


def test_an_own_file_that_does_not_load_is_not_touched(policy_dir: Path) -> None:
    store = PolicyStore.open(policy_dir)
    broken = CLAUDE.replace("action: human_approval", "action: human-approval")
    (policy_dir / "claude.yaml").write_text(broken)
    result = apply_policy_edit(store, agent="claude", tool="x", action="deny", by="marc", date=DATE)
    assert isinstance(result, EditRefused) and result.status == 422
    assert "unknown action 'human-approval'" in result.message
    assert (policy_dir / "claude.yaml").read_text() == broken
    assert not (policy_dir / "claude.yaml.bak").exists()


def test_a_hand_edit_not_yet_reloaded_is_built_on(policy_dir: Path) -> None:
    store = PolicyStore.open(policy_dir)
    hand = CLAUDE.replace(
        '  - tools: ["github.*"]', '  - tools: ["jira.*"]\n    action: allow\n  - tools: ["github.*"]'
    )
    (policy_dir / "claude.yaml").write_text(hand)
    applied(apply_policy_edit(store, agent="claude", tool="jira.delete", action="deny", by="marc", date=DATE))
    text = (policy_dir / "claude.yaml").read_text()
    # Right before the rule that decides (and above the comment attached to it).
    assert (
        '  - tools: ["jira.delete"]\n    action: deny\n'
        '  # everything else on github needs a human\n  - tools: ["jira.*"]'
    ) in text
    assert store.evaluate("claude", "jira.list").action is Action.ALLOW
    assert store.evaluate("claude", "jira.delete").action is Action.DENY


def test_refusals_write_nothing(policy_dir: Path) -> None:
    store = PolicyStore.open(policy_dir)
    for agent, action, status in [("cursor", "allow", 404), ("claude", "alow", 400), ("cursor", "alow", 400)]:
        result = apply_policy_edit(store, agent=agent, tool="x", action=action, by="m", date=DATE)
        assert isinstance(result, EditRefused) and result.status == status
    hand = "name: h\nagent: hand\nrules:\n  - tools: [t]\n    action: deny\n"
    (policy_dir / "hand.yaml").write_text(hand)
    assert store.reload() is None
    result = apply_policy_edit(store, agent="hand", tool="t", action="inherit", by="m", date=DATE)
    assert isinstance(result, EditRefused) and result.status == 409
    assert (policy_dir / "hand.yaml").read_text() == hand
    assert sorted(os.listdir(policy_dir)) == [LOCK_NAME, "claude.yaml", "default.yaml", "hand.yaml"]


def test_nothing_to_inherit_writes_nothing(policy_dir: Path) -> None:
    store = PolicyStore.open(policy_dir)
    result = applied(apply_policy_edit(store, agent="claude", tool="x", action="inherit", by="m", date=DATE))
    assert not result.changed and result.backup is None and store.generation == 0
    assert not (policy_dir / "claude.yaml.bak").exists()


def test_bom_and_crlf_survive(policy_dir: Path) -> None:
    raw = b"\xef\xbb\xbf" + CLAUDE.replace("\n", "\r\n").encode()
    (policy_dir / "claude.yaml").write_bytes(raw)
    store = PolicyStore.open(policy_dir)
    applied(apply_policy_edit(store, agent="claude", tool="a.b", action="deny", by="m", date=DATE))
    data = (policy_dir / "claude.yaml").read_bytes()
    assert data.startswith(b"\xef\xbb\xbf") and b"\n" not in data.replace(b"\r\n", b"")
    assert data.replace(f'  # set from console, {DATE} by m\r\n  - tools: ["a.b"]\r\n    action: deny\r\n'
                        .encode(), b"") == raw
    assert store.evaluate("claude", "a.b").action is Action.DENY


def test_a_symlinked_policy_file_stays_a_link(policy_dir: Path, tmp_path: Path) -> None:
    real = tmp_path / "elsewhere" / "claude.yaml"
    real.parent.mkdir()
    (policy_dir / "claude.yaml").rename(real)
    (policy_dir / "claude.yaml").symlink_to(real)
    store = PolicyStore.open(policy_dir)
    applied(apply_policy_edit(store, agent="claude", tool="a.b", action="deny", by="m", date=DATE))
    assert (policy_dir / "claude.yaml").is_symlink()
    assert '["a.b"]' in real.read_text()
    assert (real.parent / "claude.yaml.bak").read_text() == CLAUDE
    assert store.evaluate("claude", "a.b").action is Action.DENY


def test_concurrent_edits_are_serialised(policy_dir: Path) -> None:
    store = PolicyStore.open(policy_dir)
    tools = [f"svc.tool_{i}" for i in range(8)]
    results: list[object] = []

    def edit(tool: str) -> None:
        results.append(apply_policy_edit(store, agent="claude", tool=tool, action="allow", by="m", date=DATE))

    threads = [threading.Thread(target=edit, args=(t,)) for t in tools]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r, EditApplied) for r in results)
    text = (policy_dir / "claude.yaml").read_text()
    assert all(f'["{tool}"]' in text for tool in tools)
    assert all(store.evaluate("claude", tool).action is Action.ALLOW for tool in tools)
    assert store.generation == 8


_EDITOR = """
import json, sys
from drawbridge.state.policy_edits import EditApplied, apply_policy_edit
from drawbridge.state.policy_store import PolicyStore
store = PolicyStore.open(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
for i in range(int(sys.argv[3])):
    tool = f"{sys.argv[2]}.t{i}"
    r = apply_policy_edit(store, agent="claude", tool=tool, action="deny", by=sys.argv[2], date="2026-07-30")
    print(json.dumps([tool, "applied" if isinstance(r, EditApplied) else r.status]), flush=True)
"""


def test_edits_from_two_processes_are_never_acknowledged_and_lost(policy_dir: Path) -> None:
    """Two gateways (processes) editing one shared policy file at once: each edit is either in the file
    at the end or was refused 409; an applied edit is never overwritten by the other process's."""
    rounds = 25
    editors = [
        subprocess.Popen([PYTHON, "-c", _EDITOR, str(policy_dir), name, str(rounds)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=child_env())
        for name in ("a", "b")
    ]
    for editor in editors:
        assert editor.stdout is not None and editor.stdout.readline() == "ready\n"
    for editor in editors:  # both start editing at once
        assert editor.stdin is not None
        editor.stdin.write("go\n")
        editor.stdin.flush()
    outcomes: list[list[object]] = []
    for editor in editors:
        out, _ = editor.communicate(timeout=PIPE_SECONDS * 4)
        assert editor.returncode == 0
        outcomes += [json.loads(line) for line in out.splitlines()]
    assert len(outcomes) == 2 * rounds
    assert all(outcome in ("applied", 409) for _, outcome in outcomes), outcomes
    text = (policy_dir / "claude.yaml").read_text()
    lost = [tool for tool, outcome in outcomes if outcome == "applied" and f'["{tool}"]' not in text]
    assert lost == []
    assert (policy_dir / LOCK_NAME).exists()
    store = PolicyStore.open(policy_dir)
    assert all(store.evaluate("claude", str(tool)).action is Action.DENY
               for tool, outcome in outcomes if outcome == "applied")


def test_an_edit_whose_lock_cannot_be_created_is_refused_not_applied_unlocked(tmp_path: Path) -> None:
    single = tmp_path / "claude.yaml"
    single.write_text(CLAUDE)
    store = PolicyStore.open(single)
    (tmp_path / LOCK_NAME).mkdir()  # stands for a lock the gateway cannot create (as root, chmod would not)
    result = apply_policy_edit(store, agent="claude", tool="a.b", action="deny", by="m", date=DATE)
    assert isinstance(result, EditRefused) and result.status == 503, result
    assert str(tmp_path / LOCK_NAME) in result.message and "rather than applied unlocked" in result.message
    assert single.read_text() == CLAUDE and not (tmp_path / "claude.yaml.bak").exists()


def test_async_wrapper(policy_dir: Path) -> None:
    store = PolicyStore.open(policy_dir)

    async def main() -> EditApplied | EditRefused:
        return await apply_policy_edit_async(
            store, agent="claude", tool="a.b", action="deny", by="m", date=DATE
        )

    assert isinstance(anyio.run(main), EditApplied)
    assert store.evaluate("claude", "a.b").action is Action.DENY


def test_the_edit_is_recorded_in_the_trace_chain(policy_dir: Path, tmp_path: Path) -> None:
    store = PolicyStore.open(policy_dir)
    result = applied(apply_policy_edit(store, agent="claude", tool="github.create_issue", action="allow",
                                       by="marc <ops>", date=DATE))
    log_path = tmp_path / "trace.ndjson"
    with TraceLog(log_path, fsync="never") as log:
        entry = record_policy_edit(log, result, "2026-07-30T10:00:00Z")
    line = log_path.read_bytes().splitlines()[0]
    stored = json.loads(line)
    assert stored == entry and stored["kind"] == POLICY_EDIT_KIND == "mesh.policy_edit"
    without = {k: v for k, v in stored.items() if k != "entry_hash"}
    digest = hashlib.sha256(json.dumps(without, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert stored["entry_hash"] == "sha256:" + digest
    body = stored["body"]
    assert (body["action_before"], body["action_after"], body["by"], body["requested"]) == (
        "human_approval", "allow", "marc <ops>", "allow",
    )
    assert body["before"] == {"action": "human_approval", "policy": "claude", "source_file": "claude.yaml",
                              "rule_index": 2, "conditional": []}
    assert body["after"] == {"action": "allow", "policy": "claude", "source_file": "claude.yaml",
                             "rule_index": 2, "conditional": []}
    assert (body["agent"], body["tool"], body["placement"], body["changed"]) == (
        "claude", "github.create_issue", "before_deciding_rule", True,
    )
    with open(log_path, "rb") as fh:
        assert verify_chain(fh).first_problem is None
