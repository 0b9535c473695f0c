"""The control plane's credential when none is configured: made once, kept where only its owner reads it.

Invariant: no control plane runs without a credential. When the configuration names none (serve's
``auth.admin``, wrap's ``DRAWBRIDGE_ADMIN_TOKEN``), the gateway uses the token held in the file
``<state file stem>.admin-token`` beside its state file: made at the first start, reused by later
starts and by every gateway that shares the state file (so one CLI credential reaches all of them),
and refused -- the gateway does not start -- when it is anything but a regular file of this user that
nobody else may read or write, or when it holds a configured agent's token (that agent could approve
its own calls). The gateway keeps only the token's SHA-256; the token itself is never
logged, printed or put in an error message (its file's path is).

Theory of operation. ``token_file_for(state)`` names the file. ``ensure_admin_token(path)`` reads it,
or makes it: 32 random bytes, URL-safe base64, written to a private temporary file in the same
directory (mode 0600 from creation, fsynced) and linked into place with ``os.link``, which fails when
another gateway made the file first; that one is then read. A reader never sees half a token.
``read_token_file`` is the CLI's side of it.

What this does not give: an agent that runs as the same OS user can read the file. For a boundary
between agents and the control plane, run the gateway as a user of its own (README, "Security").
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from drawbridge.config_secrets import TOKEN_RULE, is_token, shared_token_problem

TOKEN_SUFFIX: Final = ".admin-token"
TOKEN_BYTES: Final = 32
_MAX_FILE_BYTES: Final = 4096


class AdminTokenProblem(Exception):
    """The token file cannot be used (the message names the file and what to do; never the token)."""


def token_file_for(state_path: str | os.PathLike[str]) -> Path:
    """The token file that goes with a state file: ``drawbridge.db`` -> ``drawbridge.admin-token``."""
    state = Path(state_path)
    return state.with_name(state.stem + TOKEN_SUFFIX)


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The token a file holds (its first line, stripped); ``AdminTokenProblem`` when it holds none."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(_MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise AdminTokenProblem(f"cannot read the admin token file {path}: {exc.strerror or exc}") from None
    try:
        token = data.decode("ascii").split("\n", 1)[0].strip()
    except UnicodeDecodeError:
        token = ""
    if len(data) > _MAX_FILE_BYTES or not is_token(token):
        raise AdminTokenProblem(f"the admin token file {path} does not hold a token ({TOKEN_RULE})")
    return token


def _check_private(path: Path) -> None:
    """Refuse a token file that is a link, not a regular file, another user's, or open to others."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISREG(info.st_mode):
        raise AdminTokenProblem(f"the admin token file {path} is not a regular file; remove it")
    if info.st_uid != os.getuid():
        raise AdminTokenProblem(f"the admin token file {path} belongs to another user; remove it")
    if info.st_mode & 0o077:
        raise AdminTokenProblem(
            f"the admin token file {path} may be read or written by other users (mode "
            f"{stat.S_IMODE(info.st_mode):04o}); remove it so that a new one is made, or chmod 600 it"
        )


def _make(path: Path) -> None:
    """Create ``path`` holding a new token, atomically; FileExistsError when it exists already."""
    token = base64.urlsafe_b64encode(secrets.token_bytes(TOKEN_BYTES)).decode("ascii").rstrip("=")
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(token.encode("ascii") + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.link(temporary, path)
    finally:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass


def ensure_admin_token(path: str | os.PathLike[str], agents: Mapping[str, str] | None = None) -> str:
    """The SHA-256 (hex) of the token in ``path``, made first if the file does not exist (module
    docstring); ``AdminTokenProblem`` when it cannot be used, or when it is the token of one of
    ``agents`` (digest -> agent id): an agent holding it could approve its own calls."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            _make(target)
        except FileExistsError:
            pass  # made earlier, or by another gateway on the same state file: use it
        _check_private(target)
    except OSError as exc:
        raise AdminTokenProblem(f"cannot make the admin token file {target}: {exc.strerror or exc}") from None
    digest = hashlib.sha256(read_token_file(target).encode("ascii")).hexdigest()
    if (agent := (agents or {}).get(digest)) is not None:
        raise AdminTokenProblem(
            shared_token_problem(f"the admin token file {target} (the control plane)", f"auth.agents (agent {agent})")
        )
    return digest


__all__ = [
    "TOKEN_SUFFIX",
    "AdminTokenProblem",
    "ensure_admin_token",
    "read_token_file",
    "token_file_for",
]
