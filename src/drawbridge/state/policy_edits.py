"""Applying a per-tool policy edit to the policy directory (shell).

Invariant: after ``apply_policy_edit`` returns, either the edit is on disk *and* in force (the
whole policy set loaded with it and the ``PolicyStore`` swapped to that set), or the edited file
holds exactly the bytes it held before and the policies in force are the ones that were. The
previous bytes of an edited file are kept beside it as ``<file>.bak``. Edits run one at a time,
across processes too: every edit holds an exclusive ``flock`` on ``.drawbridge-edit.lock`` in the
policy directory (beside the file, for a single-file store) from its first read of the file to its
reload, so replicas sharing a policy volume never lose an acknowledged edit (the second reads the
first's bytes and builds on them). A lock file that cannot be opened or created (a read-only
volume) refuses the edit (503, naming the file and why); a lock another edit holds past
``LOCK_WAIT_SECONDS`` refuses it 409. An edit is never applied unlocked.

Theory of operation, for one edit (``PUT /policies/{agent}/tools/{tool}``), under the lock:

1. Find the agent's own policy in the set in force (``edit.own_policy``) and read its file
   from disk (a leading UTF-8 byte-order mark is kept aside and put back). The file as on disk
   is parsed again: "the rule that decides today" is looked up in the set in force with this
   file's policy in place of the loaded one, so a hand edit not yet reloaded is not overwritten
   blindly. A file that does not load, or that no longer names the agent, is refused.
2. ``edit.plan_edit`` makes and checks the new text (pure).
3. The file is read again; if its bytes changed meanwhile (someone saved it), the edit is
   refused (409) rather than overwrite that change.
4. ``<file>.bak`` gets the previous bytes, then the new bytes replace the file atomically: a
   temporary file in the same directory (hidden, so the loader and the watcher ignore it),
   written, given the file's mode, fsynced, then ``os.replace``; then the directory is fsynced.
   A symbolic link is followed: the file it points to is edited (its ``.bak`` beside it), the
   link stays.
5. ``PolicyStore.reload`` loads the whole directory, as the hot-reload path does. If it fails
   (another file is broken, two files now share a name, ...) the previous bytes are written
   back the same atomic way and the located error (``file:line: problem``) is returned (422).

The result carries the fall-through action before and after (the one in force after the
reload), each with the conditional rules tried before it, so that every path a call can take is
told; the caller records it in the trace chain as ``mesh.policy_edit`` (``record_policy_edit``
does that with a ``TraceLog``). ``by`` is recorded as given: the admin token proves the right to
edit, not an identity.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio.to_thread

from drawbridge.policy.edit import (
    EditPlan,
    EditRefused,
    Placement,
    Requested,
    is_own_policy,
    own_policy,
    plan_edit,
)
from drawbridge.policy.evaluate import Candidate, explain
from drawbridge.policy.load import PolicyLoadError, PolicySource, parse_policy
from drawbridge.policy.model import Action, Decision, PolicySet
from drawbridge.state.policy_store import PolicyStore

if TYPE_CHECKING:
    from drawbridge.state.trace_log import TraceLog

POLICY_EDIT_KIND: Final = "mesh.policy_edit"
BACKUP_SUFFIX: Final = ".bak"
_BOM: Final = b"\xef\xbb\xbf"

LOCK_NAME: Final = ".drawbridge-edit.lock"
"""The file whose ``flock`` every process editing the policy directory holds (hidden: never loaded)."""
LOCK_WAIT_SECONDS: Final = 10.0
"""How long an edit waits for another's lock before it is refused (409)."""
_LOCK_POLL_SECONDS: Final = 0.02

#: One edit at a time within the process (the flock serialises processes): edits are rare, and two
#: edits of one file interleaving (read, plan, write) would lose one of them.
_EDIT_LOCK = threading.Lock()


def _where(decision: Decision, conditional: tuple[Candidate, ...]) -> dict[str, Any]:
    """Where evaluation lands when no condition holds, and the conditional rules tried before it
    (each decides the calls its conditions hold for), as the decision view tells them."""
    return {
        "action": decision.action.value,
        "policy": decision.policy,
        "source_file": decision.source_file,
        "rule_index": decision.rule_index,
        "conditional": [
            {
                "action": c.rule.action.value,
                "policy": c.policy.name,
                "source_file": c.policy.source_file,
                "rule_index": c.rule.index,
                "line": c.rule.line,
                "conditions": [{"field": cond.arg_text, "operator": cond.op.value} for cond in c.rule.conditions],
            }
            for c in conditional
        ],
    }


@dataclass(frozen=True)
class EditApplied:
    """An edit in force. ``after`` is the fall-through decision of the set now in force, and
    ``after_conditional`` the conditional rules tried before it there."""

    plan: EditPlan
    after: Decision
    path: Path | None
    backup: Path | None
    generation: int
    policy_set_digest: str = ""
    """The digest of the policy set in force after the edit (``policy_files.policy_set_digest``)."""
    after_conditional: tuple[Candidate, ...] = ()

    @property
    def changed(self) -> bool:
        return self.plan.changed

    @property
    def before_action(self) -> Action:
        return self.plan.before.action

    @property
    def after_action(self) -> Action:
        return self.after.action

    def trace_body(self) -> dict[str, Any]:
        """The body of the ``mesh.policy_edit`` trace entry (no argument data; ``by`` as given)."""
        plan = self.plan
        return {
            "agent": plan.agent,
            "tool": plan.tool,
            "requested": str(plan.requested),
            "action_before": self.before_action.value,
            "action_after": self.after_action.value,
            "before": _where(plan.before, plan.before_view.conditional),
            "after": _where(self.after, self.after_conditional),
            "policy": plan.policy,
            "source_file": plan.source_file,
            "placement": plan.placement.value,
            "rule_index": plan.rule_index,
            "removed_rules": list(plan.removed),
            "changed": plan.changed,
            "by": plan.by,
            "date": plan.date,
            "policy_set_digest": self.policy_set_digest,
        }


def record_policy_edit(trace_log: TraceLog, applied: EditApplied, at: str) -> dict[str, Any]:
    """Append the ``mesh.policy_edit`` entry for an applied edit; returns the entry."""
    return trace_log.append(POLICY_EDIT_KIND, at, applied.trace_body())


# ----------------------------------------------------------------------------- file operations


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int, owner: tuple[int, int] | None = None) -> None:
    """Replace ``path`` with ``data`` in one step, with permission bits ``mode``.

    The temporary file is hidden (``.name.*.tmp``) so that the policy loader never reads it.
    Ownership is carried over when ``owner`` is given and the process may do so.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fchmod(out.fileno(), mode)
            if owner is not None:
                try:
                    os.fchown(out.fileno(), *owner)
                except OSError:
                    pass
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)


# ----------------------------------------------------------------------------- the edit


def _decode(data: bytes) -> tuple[bytes, str]:
    bom = _BOM if data.startswith(_BOM) else b""
    return bom, data[len(bom):].decode("utf-8")


def _policy_path(store: PolicyStore, source_file: str) -> Path:
    return store.path / source_file if store.is_dir else store.path


def apply_policy_edit(
    store: PolicyStore,
    *,
    agent: str,
    tool: str,
    action: Requested | str,
    by: str,
    date: str | None = None,
) -> EditApplied | EditRefused:
    """Set (or ``inherit``) one tool's action for one agent in its own policy file, and apply it.

    ``date`` goes into the console header (default: today's UTC date, ``YYYY-MM-DD``).
    """
    if date is None:
        date = datetime.now(UTC).date().isoformat()
    with edit_lock(store) as refused:
        if refused is not None:
            return refused
        return _apply(store, agent, tool, action, by, date)


@contextlib.contextmanager
def edit_lock(store: PolicyStore) -> Iterator[EditRefused | None]:
    """The lock every change of ``store``'s files is made under (an edit, or its undo): yields None
    while held (by this thread, over every process sharing the directory), or why it cannot be had."""
    with _EDIT_LOCK, _directory_lock(lock_path(store)) as refused:
        yield refused


def lock_path(store: PolicyStore) -> Path:
    """The lock file of ``store``'s policies: in the directory, or beside a single policy file."""
    return store.path / LOCK_NAME if store.is_dir else store.path.parent / LOCK_NAME


@contextlib.contextmanager
def _directory_lock(path: Path, wait: float = LOCK_WAIT_SECONDS) -> Iterator[EditRefused | None]:
    """Hold an exclusive ``flock`` on ``path`` (created when missing) for the body; yields None when
    held, or the refusal when it cannot be had, so that no edit is ever applied unlocked."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o664)
    except OSError as exc:
        try:  # an existing lock file another user created: a read-only descriptor locks it too
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise exc
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            yield EditRefused(
                503,
                f"{path}: cannot create the policy edit lock ({exc.strerror}), so edits are refused "
                "rather than applied unlocked; the gateway needs write access to the policy directory",
            )
            return
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield EditRefused(
                        409, f"another edit of the policies holds {path} for over {wait:g} s; try again"
                    )
                    return
                time.sleep(_LOCK_POLL_SECONDS)
            except OSError as exc:
                yield EditRefused(
                    503, f"{path}: cannot lock ({exc.strerror}), so edits are refused rather than applied unlocked"
                )
                return
        yield None
    finally:
        os.close(fd)  # closing the last descriptor releases the flock


async def apply_policy_edit_async(
    store: PolicyStore,
    *,
    agent: str,
    tool: str,
    action: Requested | str,
    by: str,
    date: str | None = None,
) -> EditApplied | EditRefused:
    """``apply_policy_edit`` in a worker thread (file writes, fsync and a full reload)."""
    call = functools.partial(
        apply_policy_edit, store, agent=agent, tool=tool, action=action, by=by, date=date
    )
    return await anyio.to_thread.run_sync(call)


def _apply(
    store: PolicyStore, agent: str, tool: str, action: Requested | str, by: str, date: str
) -> EditApplied | EditRefused:
    current = store.current
    own = own_policy(current, agent)
    if own is None:
        # The planner words the refusal (after checking the request: a bad action is still a 400).
        refused = plan_edit("", policy=None, policy_set=current, agent=agent, tool=tool, action=action,
                            by=by, date=date)
        assert isinstance(refused, EditRefused)
        return refused
    shown = _policy_path(store, own.source_file)
    try:
        path = shown.resolve(strict=True)
        original = path.read_bytes()
        st = os.stat(path)
    except OSError as exc:
        return EditRefused(409, f"{shown}: cannot read the policy file: {exc.strerror}")
    try:
        bom, text = _decode(original)
    except UnicodeDecodeError as exc:
        return EditRefused(422, f"{shown}: not valid UTF-8 (byte offset {exc.start}); fix the file first")
    try:
        on_disk = parse_policy(PolicySource(own.source_file, text, str(shown)))
    except PolicyLoadError as exc:
        return EditRefused(422, f"the policy file does not load as it is on disk: {exc}", exc)
    if not is_own_policy(on_disk, agent):
        return EditRefused(
            409,
            f"{shown} changed on disk and is no longer written for agent {agent!r}; try again after reload",
        )
    for other in current.policies:
        if other is not own and other.name == on_disk.name:
            return EditRefused(
                422,
                f"{shown}: duplicate policy name {on_disk.name!r} (also in {other.source_file}); "
                "fix the file",
            )
    today = PolicySet(tuple(on_disk if p is own else p for p in current.policies))
    plan = plan_edit(
        text, policy=on_disk, policy_set=today, agent=agent, tool=tool, action=action, by=by, date=date
    )
    if isinstance(plan, EditRefused):
        return plan
    if not plan.changed:
        in_force = explain(store.current, agent, tool)
        return EditApplied(
            plan, in_force.fallthrough, None, None, store.generation, store.digest, in_force.conditional
        )

    mode = stat.S_IMODE(st.st_mode)
    owner = (st.st_uid, st.st_gid)
    backup = path.with_name(path.name + BACKUP_SUFFIX)
    try:
        if path.read_bytes() != original:
            return EditRefused(409, f"{shown} changed while the edit was prepared; try again")
        atomic_write(backup, original, mode, owner)
        atomic_write(path, bom + plan.new_text.encode("utf-8"), mode, owner)
    except OSError as exc:
        return _restore_or_report(path, original, mode, owner, f"cannot write {shown}: {exc.strerror}", 500)

    error = store.reload()
    if error is not None:
        return _restore_or_report(
            path, original, mode, owner,
            f"the policy set does not load with this edit, so the file was restored: {error}", 422, error,
        )
    after = explain(store.current, agent, tool)
    return EditApplied(
        plan, after.fallthrough, path, backup, store.generation, store.digest, after.conditional
    )


def _restore_or_report(
    path: Path,
    original: bytes,
    mode: int,
    owner: tuple[int, int],
    message: str,
    status: int,
    error: PolicyLoadError | None = None,
) -> EditRefused:
    try:
        if path.read_bytes() != original:
            atomic_write(path, original, mode, owner)
    except OSError as exc:
        return EditRefused(
            500,
            f"{message}; restoring the previous file failed ({exc.strerror}): "
            f"its previous bytes are in {path.name}{BACKUP_SUFFIX}",
            error,
        )
    return EditRefused(status, message, error)


__all__ = [
    "BACKUP_SUFFIX",
    "LOCK_NAME",
    "LOCK_WAIT_SECONDS",
    "POLICY_EDIT_KIND",
    "EditApplied",
    "Placement",
    "apply_policy_edit",
    "apply_policy_edit_async",
    "atomic_write",
    "edit_lock",
    "lock_path",
    "record_policy_edit",
]
