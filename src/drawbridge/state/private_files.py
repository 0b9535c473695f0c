"""The state file on disk before SQLite opens it: who may read it, and whose it is.

Invariant: the state file holds who approved what and the pinned catalogues, so it is created with
mode 0600 in directories created with mode 0700 (whatever the umask), and a wider mode is tightened
only on a file the running user owns that is empty or already a drawbridge state file (the SQLite
header's application id, read before anything is changed): another program's file, or another
user's, is refused exactly as it was. Every refusal is ``StateUnavailable``, naming the file once.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

from drawbridge.state.errors import StateUnavailable

FILE_MODE: Final = 0o600
DIR_MODE: Final = 0o700
_SQLITE_MAGIC: Final = b"SQLite format 3\x00"
_APPLICATION_ID_OFFSET: Final = 68


def make_private_dirs(directory: Path) -> None:
    """Create ``directory`` and its missing parents with mode 0700 whatever the umask (each one made
    here is set to 0700; an existing one is left as it is)."""
    missing: list[Path] = []
    for candidate in (directory, *directory.parents):
        if candidate.exists():
            break
        missing.append(candidate)
    for created in reversed(missing):
        try:
            os.mkdir(created, DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(created, DIR_MODE)  # mkdir's mode passes through the umask, which may widen nothing but
        # may be 000 in a container; set it exactly


def _whose(fd: int, path: Path, info: os.stat_result, application_id: int) -> str:
    """What an existing file is before its mode is touched: "empty", "ours" (a drawbridge state file),
    "blank" (a SQLite file with no application id yet), else ``StateUnavailable``: a file that is not a
    SQLite database is never ours to change."""
    if info.st_size == 0:
        return "empty"
    header = os.pread(fd, 100, 0)
    if not header.startswith(_SQLITE_MAGIC) or len(header) < _APPLICATION_ID_OFFSET + 4:
        raise StateUnavailable(f"{path} is not a drawbridge state database (not a SQLite file); refusing to use it")
    app_id = int.from_bytes(header[_APPLICATION_ID_OFFSET:_APPLICATION_ID_OFFSET + 4], "big")
    if app_id == application_id:
        return "ours"
    if app_id != 0:
        raise StateUnavailable(
            f"{path} is not a drawbridge state database (application_id {app_id:#x}); refusing to use it"
        )
    return "blank"


def secure_file(path: Path, application_id: int) -> None:
    """Create ``path`` with mode 0600, or tighten an existing file to 0600 -- only a regular file the
    running user owns that is empty or already a drawbridge state file (``_whose``): a foreign file
    (another program's, another user's) is refused as it is, never changed."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        os.close(fd)
        return  # made here, 0600
    except FileExistsError:
        pass
    except FileNotFoundError:
        raise StateUnavailable(f"cannot open the state database {path}: directory {path.parent} does not exist") from None
    except OSError as exc:
        raise StateUnavailable(f"cannot open the state database {path}: {exc.strerror}") from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise StateUnavailable(f"cannot open the state database {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise StateUnavailable(f"cannot open the state database {path}: not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        kind = _whose(fd, path, info, application_id)
        if mode & 0o077:
            if info.st_uid != os.geteuid():
                raise StateUnavailable(
                    f"state database {path} is readable by others (mode {mode:o}) and belongs to another user; "
                    "drawbridge does not change another user's file: restrict it to 0600 or use another state_path"
                )
            if kind == "blank":
                raise StateUnavailable(
                    f"{path} is readable by others (mode {mode:o}) and is not a drawbridge state database yet; "
                    "restrict it to 0600 or remove it"
                )
            try:
                os.fchmod(fd, FILE_MODE)
            except OSError as exc:
                raise StateUnavailable(
                    f"state database {path} is readable by others (mode {mode:o}) "
                    f"and cannot be restricted to 0600: {exc.strerror}"
                ) from None
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        try:
            side_info = side.lstat()
            if stat.S_IMODE(side_info.st_mode) & 0o077:
                if side_info.st_uid != os.geteuid() or not stat.S_ISREG(side_info.st_mode):
                    raise StateUnavailable(f"{side} is readable by others and not the running user's file")
                side.chmod(FILE_MODE)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StateUnavailable(f"cannot restrict {side} to mode 0600: {exc.strerror}") from None


__all__ = ["DIR_MODE", "FILE_MODE", "make_private_dirs", "secure_file"]
