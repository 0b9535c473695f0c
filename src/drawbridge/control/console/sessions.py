"""Console sessions: who logged in, until when, and the token that proves a form came from a console page.

Invariant: a console request acts only for a live session, and a state-changing one only when it
also carries that session's CSRF token. A session is made only by a login that presented the admin
token (``AdminAuth.token_matches``); the admin token is never kept, only a random session id (in an
HttpOnly, SameSite=Strict cookie scoped to ``/console``) and a random CSRF token (in the pages' forms).
Both are compared in constant time. A session also keeps the last ``MAX_NOTES`` one-line results of
its actions, each under a random key that the redirect after the action carries (``?note=<key>``):
a page shows a notice only when its session wrote it, so a link cannot make the console say anything.
A session expires ``SESSION_TTL`` after login, ends at logout,
and is forgotten when the gateway stops: sessions live in this process's memory only, so nothing of
them reaches the state file, the trace or a log line.

Theory of operation. ``SessionStore`` maps ``sha256(session id)`` to a ``Session`` (so even the memory
holds no cookie value usable as is). ``open`` makes one; ``find`` returns the live session a request's
cookie names, or None; ``close`` forgets one. At most ``MAX_SESSIONS`` are kept: the oldest goes first.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

from drawbridge.control.services import utc_clock

COOKIE: Final = "drawbridge_console"
COOKIE_PATH: Final = "/console"
SESSION_TTL: Final = timedelta(hours=8)
MAX_SESSIONS: Final = 256
MAX_OPERATOR_CHARS: Final = 80
MAX_NOTES: Final = 16
NOTE_KEY_BYTES: Final = 9


@dataclass(frozen=True, slots=True)
class Note:
    """The result of one action, as the page it returns to shows it: a notice, or a problem."""

    message: str
    ok: bool


@dataclass(frozen=True, slots=True)
class Session:
    """One logged-in operator: the name recorded as ``by`` on every action, and the CSRF token."""

    operator: str
    csrf: str
    expires_at: datetime
    notes: dict[str, Note] = field(default_factory=dict, compare=False, repr=False)

    def csrf_matches(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self.csrf.encode())

    def remember(self, message: str, ok: bool) -> str:
        """Keep an action's result for the page it returns to; the key the redirect carries."""
        key = secrets.token_urlsafe(NOTE_KEY_BYTES)
        self.notes[key] = Note(message, ok)
        while len(self.notes) > MAX_NOTES:
            self.notes.pop(next(iter(self.notes)))
        return key

    def note(self, key: str | None) -> Note | None:
        """The result this session kept under ``key``; None for a key it never gave out."""
        return self.notes.get(key) if key else None


def _key(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class SessionStore:
    """The console's sessions, in memory (module docstring)."""

    def __init__(self, clock: Callable[[], datetime] = utc_clock, ttl: timedelta = SESSION_TTL) -> None:
        self._clock = clock
        self._ttl = ttl
        self._sessions: dict[str, Session] = {}

    @property
    def ttl(self) -> timedelta:
        return self._ttl

    def open(self, operator: str) -> tuple[str, Session]:
        """A new session for ``operator``: its id (the cookie's value) and the session."""
        self._sweep()
        while len(self._sessions) >= MAX_SESSIONS:
            self._sessions.pop(next(iter(self._sessions)))
        session_id = secrets.token_urlsafe(32)
        session = Session(operator, secrets.token_urlsafe(32), self._clock() + self._ttl)
        self._sessions[_key(session_id)] = session
        return session_id, session

    def find(self, session_id: str | None) -> Session | None:
        """The live session ``session_id`` names; None when unknown, ended or expired."""
        if not session_id:
            return None
        key = _key(session_id)
        session = self._sessions.get(key)
        if session is None:
            return None
        if session.expires_at <= self._clock():
            del self._sessions[key]
            return None
        return session

    def close(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(_key(session_id), None)

    def _sweep(self) -> None:
        now = self._clock()
        for key in [k for k, s in self._sessions.items() if s.expires_at <= now]:
            del self._sessions[key]


def operator_name(raw: str | None) -> str | None:
    """The name given at login, fit to record as ``by`` (printable, bounded); None when unusable."""
    if raw is None:
        return None
    name = " ".join(raw.split())
    if not name or len(name) > MAX_OPERATOR_CHARS or not name.isprintable():
        return None
    return name


__all__ = ["COOKIE", "COOKIE_PATH", "SESSION_TTL", "Note", "Session", "SessionStore", "operator_name"]
