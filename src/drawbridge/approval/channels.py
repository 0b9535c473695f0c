"""Who can resolve an approval, and how much each answer proves.

Invariant: every resolution names the channel it came through, and the
strength of the approval is a function of that channel alone (the table
``STRENGTH`` below), never of what the resolver claims about itself. Evidence
states the strength next to the outcome, so that a reader can tell "an
operator the gateway authenticated said yes" from "the MCP client said yes".

Why the distinction: an in-band elicitation answer proves only that the client
answered. A client may auto-accept forms, map a timeout to an answer, or show
the form to nobody (peers.md 2.6, 5.3). The control plane, the web console, the
CLI and the gateway's own terminal reach a person the gateway itself
identified (an admin token, a console session, OS access to the 0600 state
file, the terminal the gateway runs on). Memory is neither: nobody decided
this call; earlier human approvals of the same agent, tool and argument shape
stand in for a decision. The system channel only ever ends an approval
without a human (timeout, restart), and that always means deny.
"""

from __future__ import annotations

import enum
from typing import Final


class Channel(enum.StrEnum):
    """How a resolution reached the gateway."""

    ELICITATION = "elicitation"  # in-band MCP elicitation answered by the client
    CONTROL_PLANE = "control_plane"  # HTTP control plane, admin-authenticated
    CONSOLE = "console"  # web console session on the control plane
    CLI = "cli"  # the drawbridge command, with access to the state file or the control plane
    TTY = "tty"  # a prompt on the terminal the gateway runs on
    MEMORY = "memory"  # automatic: enough earlier approvals, no denial (approval/memory.py)
    SYSTEM = "system"  # the gateway itself: timeout or restart; never approves


class Strength(enum.StrEnum):
    """What an approval through a channel proves."""

    OPERATOR = "operator"
    """A person the gateway authenticated decided this call."""
    CLIENT = "client"
    """The MCP client answered; whether a person saw the question is not proven."""
    MEMORY = "memory"
    """Nobody decided this call; consistent earlier approvals of its shape did."""
    SYSTEM = "system"
    """No person decided; the gateway ended the approval (always as a refusal)."""


STRENGTH: Final[dict[Channel, Strength]] = {
    Channel.ELICITATION: Strength.CLIENT,
    Channel.CONTROL_PLANE: Strength.OPERATOR,
    Channel.CONSOLE: Strength.OPERATOR,
    Channel.CLI: Strength.OPERATOR,
    Channel.TTY: Strength.OPERATOR,
    Channel.MEMORY: Strength.MEMORY,
    Channel.SYSTEM: Strength.SYSTEM,
}

HUMAN_CHANNELS: Final = frozenset(c for c, s in STRENGTH.items() if s in (Strength.OPERATOR, Strength.CLIENT))
"""Channels through which an answer may come from a person (memory and system are not among them)."""


def strength_of(channel: Channel | str) -> Strength:
    """The strength of an approval that came through ``channel``; unknown channels raise ValueError."""
    return STRENGTH[Channel(channel)]
