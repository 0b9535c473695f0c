"""Which gateways are running on one SQLite state file: a lock file each, held for the process's life.

Invariant: a gateway that starts on a SQLite state file ends (``system:restart``) only the approvals
whose opening gateway is gone, never those of a gateway still running on the same file. Each gateway
draws an instance id (``gateway-<16 hex>``), records it on every approval it opens (the ``replica``
column, where a replica on PostgreSQL records its ``replica.id``), and holds an exclusive ``flock`` on
``<state file>.instances/<id>.lock`` (mode 0600, in a folder of mode 0700) until it closes its state.
The kernel drops the lock when the process ends, however it ends, so a crashed gateway's lock can be
taken: that, or a missing lock file, is what "gone" means. A row without an owner (written before
instance ids were recorded) has no lock to ask, and is treated as gone: the behaviour it had.

Theory of operation. ``hold`` makes the lock file under a staging name, locks it, and only then renames
it into place, so no other gateway ever finds an unlocked lock file of a live instance (and removes it
as stale). ``gone`` tries each owner's lock without waiting: taken, the file is stale and removed (the
lock is held while it is unlinked, so a live instance's file is never removed); refused, the owner
runs. ``sweep`` does the same for every lock file in the folder, so crashed gateways that opened no
approval leave nothing behind either. A lock file that cannot be read (another user's, a permission
changed by hand) is taken to belong to a running gateway: its approvals then end at their timeout,
never by a guess.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from drawbridge.state.errors import StateUnavailable
from drawbridge.state.private_files import FILE_MODE, make_private_dirs

INSTANCE_RE: Final = re.compile(r"gateway-[0-9a-f]{16}", re.ASCII)
_LOCK_SUFFIX: Final = ".lock"

logger = logging.getLogger("drawbridge.state")


def instances_dir(state_path: Path) -> Path:
    """The folder of lock files beside a state file: ``drawbridge.db`` -> ``drawbridge.db.instances``."""
    return state_path.with_name(state_path.name + ".instances")


class InstanceLock:
    """This process's claim on a state file, held until ``release`` (or the process's end)."""

    def __init__(self, instance_id: str, path: Path, fd: int) -> None:
        self.instance_id = instance_id
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        """Remove the lock file, then let go of the lock. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass  # left behind, it is stale once the lock below is gone, and the next start removes it
        finally:
            os.close(fd)


def hold(state_path: Path) -> InstanceLock:
    """Draw an instance id and hold its lock; ``StateUnavailable`` when the folder cannot be written."""
    folder = instances_dir(state_path)
    instance_id = f"gateway-{secrets.token_hex(8)}"
    final = folder / f"{instance_id}{_LOCK_SUFFIX}"
    staging = folder / f".{instance_id}.new"
    try:
        make_private_dirs(folder)
        fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, FILE_MODE)
    except OSError as exc:
        raise StateUnavailable(f"cannot make the instance lock in {folder}: {exc.strerror or exc}") from None
    try:
        os.fchmod(fd, FILE_MODE)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(staging, final)
    except OSError as exc:
        os.close(fd)
        staging.unlink(missing_ok=True)
        raise StateUnavailable(f"cannot make the instance lock in {folder}: {exc.strerror or exc}") from None
    sweep(state_path)
    return InstanceLock(instance_id, final, fd)


def _stale(path: Path) -> bool:
    """True when no running process holds the lock file ``path`` (removed then) or it is missing."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return True
    except OSError as exc:
        logger.warning("cannot read the instance lock %s (%s); its gateway is taken to run", path, exc.strerror)
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError as exc:
            logger.warning("cannot lock %s (%s); its gateway is taken to run", path, exc.strerror)
            return False
        path.unlink(missing_ok=True)  # its gateway ended without removing it (a crash)
        return True
    finally:
        os.close(fd)


def gone(state_path: Path, owners: Iterable[str]) -> list[str]:
    """The instance ids among ``owners`` whose gateway no longer runs (their stale lock files removed);
    an owner that is not an instance id (a ``replica.id``) is never among them."""
    folder = instances_dir(state_path)
    return [o for o in owners if INSTANCE_RE.fullmatch(o) and _stale(folder / f"{o}{_LOCK_SUFFIX}")]


def sweep(state_path: Path) -> None:
    """Remove the lock files of gateways that ended without removing theirs."""
    try:
        names = os.listdir(instances_dir(state_path))
    except OSError:
        return
    gone(state_path, (n.removesuffix(_LOCK_SUFFIX) for n in names if n.endswith(_LOCK_SUFFIX)))


__all__ = ["INSTANCE_RE", "InstanceLock", "gone", "hold", "instances_dir", "sweep"]
