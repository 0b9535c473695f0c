"""Hot reload: a valid edit is swapped in whole; an invalid edit keeps the previous policies and says why."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from conftest import eventually_async, scaled

from drawbridge.policy import Action, PolicyLoadError
from drawbridge.state.policy_store import PolicyStore, ReloadResult, watch_policies

ALLOW = "name: demo\nagent: demo-agent\nrules:\n  - tools: [get_repo]\n    action: allow\n"
DENY = "name: demo\nagent: demo-agent\nrules:\n  - tools: [get_repo]\n    action: deny\n"
BROKEN = "name: demo\nagent: demo-agent\nrules:\n  - tools: [get_repo]\n    action: alow\n"
DEFAULT = "name: default\nagent: '*'\nrules:\n  - tools: ['*']\n    action: deny\n"


def write(path: Path, body: str, tick: int = 0) -> None:
    """Write and move the mtime forward, so a change is visible even on coarse-timestamp filesystems."""
    path.write_text(body)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + (tick + 1) * 1_000_000_000))


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    d = tmp_path / "policies"
    d.mkdir()
    write(d / "demo.yaml", ALLOW)
    write(d / "default.yaml", DEFAULT)
    return d


def test_open_loads_and_refuses_an_invalid_directory(policy_dir: Path, tmp_path: Path) -> None:
    store = PolicyStore.open(policy_dir)
    assert store.evaluate("demo-agent", "get_repo").action is Action.ALLOW
    assert (store.generation, store.last_error) == (0, None)
    bad = tmp_path / "bad"
    bad.mkdir()
    write(bad / "x.yaml", BROKEN)
    with pytest.raises(PolicyLoadError) as info:
        PolicyStore.open(bad)
    expected = "unknown action 'alow' (allowed: allow, human_approval, deny)"
    assert str(info.value) == f"{bad / 'x.yaml'}:5: {expected}"


def test_reload_swaps_a_valid_edit(policy_dir: Path) -> None:
    store = PolicyStore.open(policy_dir)
    before = store.current
    write(policy_dir / "demo.yaml", DENY, tick=1)
    assert store.reload() is None
    assert store.current is not before
    assert (store.generation, store.last_error) == (1, None)
    d = store.evaluate("demo-agent", "get_repo")
    assert (d.action, d.source_file, d.rule_index) == (Action.DENY, "demo.yaml", 0)
    assert before is not store.current and before.policies[0].rules[0].action is Action.ALLOW


def test_reload_keeps_the_previous_set_on_an_invalid_edit(policy_dir: Path) -> None:
    store = PolicyStore.open(policy_dir)
    before = store.current
    write(policy_dir / "demo.yaml", BROKEN, tick=1)
    error = store.reload()
    assert isinstance(error, PolicyLoadError)
    assert (error.file, error.line) == (str(policy_dir / "demo.yaml"), 5)
    assert "unknown action 'alow'" in error.problem
    assert store.current is before
    assert store.last_error is error and store.generation == 0
    assert store.evaluate("demo-agent", "get_repo").action is Action.ALLOW
    # A new file with a duplicate name is also refused as a whole.
    write(policy_dir / "demo.yaml", ALLOW, tick=2)
    write(policy_dir / "zz.yaml", ALLOW, tick=2)
    error = store.reload()
    assert error is not None and "duplicate policy name 'demo'" in error.problem
    assert store.current is before
    # Fixing the edit loads again.
    (policy_dir / "zz.yaml").unlink()
    write(policy_dir / "demo.yaml", DENY, tick=3)
    assert store.reload() is None and store.last_error is None
    assert store.evaluate("demo-agent", "get_repo").action is Action.DENY


def test_removing_the_directory_keeps_the_previous_set(policy_dir: Path) -> None:
    store = PolicyStore.open(policy_dir)
    before = store.current
    for f in policy_dir.iterdir():
        f.unlink()
    policy_dir.rmdir()
    error = store.reload()
    assert error is not None and error.problem == "policy directory does not exist"
    assert store.current is before


def test_single_file_store(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    write(path, ALLOW)
    store = PolicyStore.open(path)
    assert store.evaluate("demo-agent", "get_repo").action is Action.ALLOW
    write(path, DENY, tick=1)
    assert store.reload() is None
    assert store.evaluate("demo-agent", "get_repo").action is Action.DENY


def test_watcher_reloads_valid_edits_and_reports_invalid_ones(policy_dir: Path) -> None:
    store = PolicyStore.open(policy_dir)
    results: list[ReloadResult] = []

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: watch_policies(store, interval_ms=10, on_reload=results.append))
            await anyio.sleep(scaled(0.05))  # several polls of 10 ms
            assert results == []  # nothing changed, nothing reloaded

            write(policy_dir / "demo.yaml", DENY, tick=1)
            await eventually_async(lambda: store.generation == 1)
            assert store.evaluate("demo-agent", "get_repo").action is Action.DENY
            assert results[-1].ok and results[-1].generation == 1

            kept = store.current
            write(policy_dir / "demo.yaml", BROKEN, tick=2)
            await eventually_async(lambda: len(results) == 2)
            assert not results[-1].ok and results[-1].generation == 1
            assert "unknown action 'alow'" in str(results[-1].error)
            assert store.current is kept
            await anyio.sleep(scaled(0.1))  # several more polls
            assert len(results) == 2  # a broken state is reported once, not at every poll

            write(policy_dir / "extra.yaml", "name: extra\nagent: x\nrules: []\n", tick=3)
            write(policy_dir / "demo.yaml", ALLOW, tick=3)
            await eventually_async(lambda: store.generation == 2)
            assert store.evaluate("demo-agent", "get_repo").action is Action.ALLOW
            assert [p.name for p in store.current.policies] == ["demo", "extra", "default"]
            tg.cancel_scope.cancel()

    anyio.run(main)


def test_watcher_rejects_a_bad_interval(policy_dir: Path) -> None:
    store = PolicyStore.open(policy_dir)
    with pytest.raises(ValueError):
        anyio.run(lambda: watch_policies(store, interval_ms=0))


def test_a_policy_file_whose_link_is_broken_fails_the_load_and_the_reload_keeps_the_previous_set(
    policy_dir: Path, tmp_path: Path
) -> None:
    """A stricter policy held through a symbolic link (as a Kubernetes ConfigMap mounts its files) must
    not vanish when the link's target does: its rules would be dropped and a broader policy decide."""
    real = tmp_path / "real"
    real.mkdir()
    write(real / "strict.yaml", "name: strict\nagent: demo-agent\nrules:\n  - tools: [get_repo]\n    action: deny\n")
    (policy_dir / "demo.yaml").unlink()
    write(policy_dir / "broad.yaml", "name: broad\nagent: '*'\nrules:\n  - tools: [get_repo]\n    action: allow\n")
    (policy_dir / "strict.yaml").symlink_to(real / "strict.yaml")
    store = PolicyStore.open(policy_dir)
    assert store.evaluate("demo-agent", "get_repo").action is Action.DENY
    before = store.current
    (real / "strict.yaml").rename(real / "moved.yaml")
    error = store.reload()
    assert isinstance(error, PolicyLoadError)
    assert (error.file, error.problem) == (str(policy_dir / "strict.yaml"), "file does not exist")
    assert store.current is before
    assert store.evaluate("demo-agent", "get_repo").action is Action.DENY
    with pytest.raises(PolicyLoadError, match=r"strict\.yaml: file does not exist$"):
        PolicyStore.open(policy_dir)
