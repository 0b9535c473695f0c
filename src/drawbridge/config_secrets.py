"""The secrets a configuration names: tokens given as a SHA-256 or by an environment variable.

Invariant: a token's value never leaves this module; what the configuration keeps is its SHA-256. A
command reads only the secrets it uses (``USES_ALL`` for ``serve`` over HTTP; ``discover`` uses none,
``serve --stdio`` no agent token; ``notify``: the approval webhooks' URLs, ``config_notify``), so a variable it does not use is not required. A token read from a
variable is one line of 16 to 512 printable ASCII characters (``is_token``), the rule the CLI holds the
admin token to (``gateway.runtime.admin_token``): a token that short or that odd is refused at load,
naming the variable, never the value. No two uses hold one token (``shared_token``): not two agents
(the evidence would name the wrong one), and never an agent and the control plane, whose token approves
calls -- an agent holding it could approve its own. Tokens are compared by value (their digests), so
two variables holding the same token are caught as surely as one variable named twice.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Final, TypeVar

from drawbridge.config_reader import Reader, env_name_problem

_Where = TypeVar("_Where")

HEX64: Final = re.compile(r"[0-9a-f]{64}")
USES_ALL: Final = frozenset({"admin", "agents", "notify"})
"""The secrets ``serve`` over HTTP uses: the control plane's and the agents' tokens, the webhooks' URLs."""
TOKEN_RULE: Final = "one line of 16 to 512 printable ASCII characters"
"""What a bearer token is, said in the messages that refuse one."""


def is_token(token: str) -> bool:
    """Whether ``token`` is a bearer token this project accepts (``TOKEN_RULE``): long enough not to be
    guessed, and plain enough to travel in a header and a file unchanged."""
    return 16 <= len(token) <= 512 and all(0x21 <= ord(ch) <= 0x7E for ch in token)


def token_digest(
    reader: Reader, env: Mapping[str, str], what: str, used: bool = True
) -> str | None:
    """The SHA-256 of a token given as ``token_sha256`` or ``token_env``; never the token itself. A
    command that does not use this secret (``used`` false) is not refused for a missing variable:
    it gets ``""``."""
    digest = reader.get("token_sha256", str)
    env_name = reader.get("token_env", str)
    if digest is not None and env_name is not None:
        raise reader.fail("token_env", f"{what}: give token_sha256 or token_env, not both")
    if digest is not None:
        if not HEX64.fullmatch(digest):
            raise reader.fail("token_sha256", f"{what}: token_sha256 must be 64 lowercase hex characters")
        return digest
    if env_name is not None:
        if (problem := env_name_problem(env_name, f"{what}: token_env", "the token")) is not None:
            raise reader.fail("token_env", problem)
        token = env.get(env_name, "")
        if not token and not used:
            return ""
        if not token:
            raise reader.fail("token_env", f"{what}: environment variable {env_name} is missing or empty")
        if not is_token(token):
            raise reader.fail(
                "token_env", f"{what}: environment variable {env_name} does not hold a token ({TOKEN_RULE})"
            )
        return hashlib.sha256(token.encode()).hexdigest()
    return None


def shared_token(
    holders: Sequence[tuple[str, str, _Where]],
) -> tuple[tuple[str, str, _Where], tuple[str, str, _Where]] | None:
    """The first two of ``(use, digest, where)`` that hold one token, or None when every token is its own."""
    seen: dict[str, tuple[str, str, _Where]] = {}
    for holder in holders:
        if holder[1] in seen:
            return seen[holder[1]], holder
        seen[holder[1]] = holder
    return None


def shared_token_problem(first: str, second: str) -> str:
    """The refusal of two uses of one token; it names the uses, never the token."""
    if first.startswith("auth.agents") and second.startswith("auth.agents"):
        return f"two agents share one bearer token: {first} and {second}; give each agent its own"
    return (
        f"{first} and {second} hold one bearer token: the agent could use the control plane and approve "
        "its own calls; give the control plane a token of its own"
    )


def token_env_names(top: Reader) -> frozenset[str]:
    """The variables ``auth`` reads tokens from (``auth.admin``, each of ``auth.agents``), once the
    section is accepted: named whether this command uses the token or not, none may reach a child."""
    auth = top.node.get("auth")
    if not isinstance(auth, Mapping):
        return frozenset()
    admin, agents = auth.get("admin"), auth.get("agents")
    entries = [admin, *(agents if isinstance(agents, list) else ())]
    return frozenset(entry["token_env"] for entry in entries
                     if isinstance(entry, Mapping) and isinstance(entry.get("token_env"), str))


__all__ = [
    "HEX64", "TOKEN_RULE", "USES_ALL", "is_token", "shared_token", "shared_token_problem", "token_digest",
    "token_env_names",
]
