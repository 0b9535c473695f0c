"""The state layer's failures, shared by both backends and every store.

Invariant: every failure of the state database is ``StateUnavailable``, whose message names the
database (a file path, or a URL with its password masked) for the operator and whose ``detail`` names
neither, for what an agent may read. Neither ever holds an argument value.
"""

from __future__ import annotations


class StateError(Exception):
    """Base of errors raised by the state layer."""


class StateUnavailable(StateError):
    """The state database cannot be opened, read or written. Callers fail closed.

    The message names the database (a file path, or a URL without its password) for the operator;
    ``detail`` says what failed without naming it, for what an agent may be told."""

    def __init__(self, message: str, *, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail if detail is not None else "the state could not be read or written"


def failure_text(exc: BaseException) -> str:
    """What to log of a failure that refused a call: a state failure's whole message (the database and
    the cause, never an argument or a password), otherwise only the exception's type, whose text may
    quote arguments."""
    return str(exc) if isinstance(exc, StateUnavailable) else type(exc).__name__


__all__ = ["StateError", "StateUnavailable", "failure_text"]
