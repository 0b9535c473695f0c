"""The state layer's failures, shared by both backends and every store.

Invariant: every failure of the state database is ``StateUnavailable``, whose message names the
database (a file path, or a URL with its password masked) for the operator and whose ``detail`` names
neither, for what an agent may read. Neither ever holds an argument value. A failure raised inside a
task group reaches the caller wrapped in an exception group: ``state_failure`` and ``failure_text``
look inside it, so the cause is still named.
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


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def state_failure(exc: BaseException) -> StateUnavailable | None:
    """The state failure ``exc`` is, or the first one an exception group (however nested) holds."""
    return next((leaf for leaf in _leaves(exc) if isinstance(leaf, StateUnavailable)), None)


def failure_text(exc: BaseException) -> str:
    """What to log of a failure that refused a call: a state failure's whole message (the database and
    the cause, never an argument or a password), otherwise only the exception's type, whose text may
    quote arguments. An exception group is named by what it holds (its first state failure, else the
    types of its exceptions), not as ``ExceptionGroup``."""
    state = state_failure(exc)
    if state is not None:
        return str(state)
    if isinstance(exc, BaseExceptionGroup):
        return f"{type(exc).__name__} of " + ", ".join(type(leaf).__name__ for leaf in _leaves(exc))
    return type(exc).__name__


__all__ = ["StateError", "StateUnavailable", "failure_text", "state_failure"]
