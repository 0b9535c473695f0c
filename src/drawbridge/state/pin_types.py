"""What the pin store reads and writes: the kinds it pins, the definitions handed in, the pins and
observations read back, an accepted change (whose ``record()`` is the ``mesh.pin_accept`` body), and
the errors, kept apart from the SQL (``state.pins``) so both stay small.

Invariant: one store pins one kind (``tool`` or ``prompt``); a pin, an observation and a first use
belong to a (server, kind), so a tool and a prompt of the same name never share a row.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from drawbridge.canonical import sanitize
from drawbridge.state.sqlite import StateError, StateUnavailable, to_db_time

FIRST_USE_BY: Final = "system:first-use"
TOOL: Final = "tool"
PROMPT: Final = "prompt"
KINDS: Final = (TOOL, PROMPT)
"""What a pin store pins; each kind has its own pins, observations and first use per server."""
MAX_NAME: Final = 1024


class PinStoreUnavailable(StateUnavailable):
    """The pins of ``server`` cannot be read or written: hold every tool (or prompt) of that server back."""

    def __init__(self, server: str, detail: str, *, cause: str | None = None, kind: str = "tool") -> None:
        super().__init__(
            f"pin store unavailable for server {sanitize(server)!r}: {detail}; "
            f"every {kind} of this server is held back until the pin store can be read",
            detail=detail,
        )
        self.server = server
        self.cause = cause if cause is not None else detail
        """What failed, for the log and the records: the database named (never its password)."""


class PinError(StateError):
    """A pin operation the store refuses (named in the message)."""


class InvalidPin(PinError, ValueError):
    """A tool definition that cannot be pinned (bad name, fingerprint or description)."""


class UnknownTool(PinError, LookupError):
    """``accept`` was given a tool that is neither pinned nor observed for the server."""


class PinConflict(PinError):
    """``accept`` was bound to reviewed fingerprints and the server offers something else now."""


@dataclass(frozen=True, slots=True)
class ToolDefinition:
    """What the catalogue hands in for one tool: its fingerprint, its description (None if absent)
    and the JCS text the fingerprint covers (None when not given)."""

    fingerprint: str
    description: str | None = None
    definition: str | None = None


@dataclass(frozen=True, slots=True)
class PinnedTool:
    fingerprint: str
    description: str | None
    pinned_at: datetime
    pinned_by: str = ""
    definition: str | None = None


@dataclass(frozen=True, slots=True)
class ObservedTool:
    fingerprint: str
    description: str | None
    observed_at: datetime
    definition: str | None = None


@dataclass(frozen=True, slots=True)
class PinAcceptance:
    """One accepted change: ``previous`` None for a new tool, ``accepted`` None for a removed one."""

    server: str
    name: str
    previous: PinnedTool | None
    accepted: PinnedTool | None
    accepted_by: str
    at: datetime
    kind: str = "tool"
    """What was pinned: ``tool`` or ``prompt``."""

    def record(self) -> dict[str, Any]:
        """Trace-chain body for ``mesh.pin_accept``. A tool's is as it always was (``tool``: its name);
        a prompt's names it under ``prompt`` and adds ``"kind": "prompt"`` (no ``kind`` means a tool)."""
        body: dict[str, Any] = {
            "server": self.server,
            **({} if self.kind == TOOL else {"kind": self.kind}),
            self.kind: self.name,
            "accepted_by": self.accepted_by,
            "at": to_db_time(self.at),
            "previous_fingerprint": self.previous.fingerprint if self.previous else None,
            "previous_description": self.previous.description if self.previous else None,
            "fingerprint": self.accepted.fingerprint if self.accepted else None,
            "description": self.accepted.description if self.accepted else None,
            "removed": self.accepted is None,
        }
        return body
