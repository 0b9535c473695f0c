"""The state and replica sections of serve's configuration: where the state lives (``state``) and
what a replica shares with the others on it (``replica``: its id and the key rings).

Invariant: what loads here is complete for the backend it names. ``state`` is a PostgreSQL URL
(``postgresql://...``, or ``{url | url_env, pool_size}``); without it the state is the SQLite file
of ``state_path``. Keys are never in the file: each key ring entry names an environment variable
holding at least 32 bytes (hex or base64), and a gateway on PostgreSQL does not start without both
rings, because replicas that drew their own keys would not honour each other's approvals or
``requestState`` tokens.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ruamel.yaml.comments import CommentedSeq

from drawbridge.config_reader import Reader, env_name_problem, item_line

MIN_KEY_BYTES: Final = 32
DEFAULT_POOL_SIZE: Final = 10
_KEY_ID_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")
_REPLICA_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")
_URL_RE: Final = re.compile(r"postgres(?:ql)?://\S+")


@dataclass(frozen=True)
class RingKey:
    key_id: str
    key: bytes = field(repr=False)


@dataclass(frozen=True)
class SharedState:
    """State on PostgreSQL, shared by replicas: the database, this replica's id and the key rings
    (first key of each ring is the one in use; the others still verify)."""

    url: str = field(repr=False)
    pool_size: int
    replica_id: str | None
    binding_keys: tuple[RingKey, ...] = ()
    request_state_keys: tuple[RingKey, ...] = ()


def _key_bytes(text: str) -> bytes | None:
    text = text.strip()
    if re.fullmatch(r"(?:[0-9a-fA-F]{2})+", text):
        return bytes.fromhex(text)
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None


def _ring(section: Reader, key: str, env: Mapping[str, str]) -> tuple[RingKey, ...]:
    entries = section.get(key, object, default=[])
    if not isinstance(entries, (CommentedSeq, list)) or not entries:
        raise section.fail(key, f"{section.where}.{key} must be a non-empty list of {{id, env}}")
    ring: list[RingKey] = []
    for index, node in enumerate(entries):
        entry = Reader(section.file, node, f"{section.where}.{key}[{index}]", line=item_line(entries, index))
        entry.check_keys({"id", "env"})
        key_id = entry.get("id", str, required=True)
        if not _KEY_ID_RE.fullmatch(key_id) or any(k.key_id == key_id for k in ring):
            raise entry.fail("id", f"{entry.where}.id must be a unique [A-Za-z0-9._-]{{1,64}}")
        name = entry.get("env", str, required=True)
        if (problem := env_name_problem(name, f"{entry.where}.env", "the key")) is not None:
            raise entry.fail("env", problem)
        material = _key_bytes(env.get(name, ""))
        if material is None or len(material) < MIN_KEY_BYTES:
            raise entry.fail(
                "env", f"key {key_id}: environment variable {name} must hold at least {MIN_KEY_BYTES} bytes "
                "(hex or base64); it is missing, empty or too short"
            )
        ring.append(RingKey(key_id, material))
    return tuple(ring)


_ANY_URL: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
URL_AS_PATH: Final = (
    "is a URL, not a SQLite file path; state on PostgreSQL is `state: postgresql://...` with a replica "
    "section (docs/deployment.md)"
)
"""Why a state file path that is a URL is refused, without the URL (it may hold a password): taken as a
path it would name a local file in a directory named after the URL, credentials and all."""


def looks_like_url(location: str) -> bool:
    """Whether a location given as a SQLite file path is a URL (``scheme://...``) instead."""
    return _ANY_URL.match(location) is not None


def state_file(top: Reader) -> str:
    """``state_path`` as written: a SQLite file path, never a URL (``URL_AS_PATH``; its value is not repeated)."""
    path = top.get("state_path", str, default="./drawbridge.db")
    if looks_like_url(path):
        raise top.fail("state_path", f"state_path {URL_AS_PATH}")
    return path


def state_section(top: Reader, env: Mapping[str, str]) -> SharedState | None:
    """``state`` and ``replica``: None keeps the SQLite file of ``state_path``."""
    if "state" in top.node and top.node["state"] is None:
        raise top.null("state")  # not the local SQLite file: replicas would each keep their own state
    raw: Any = top.node.get("state")
    if raw is None:
        if top.child("replica") is not None:
            raise top.fail("replica", "replica needs state: a PostgreSQL URL the replicas share")
        return None
    pool_size = DEFAULT_POOL_SIZE
    if isinstance(raw, str):
        url = raw
    else:
        state = top.child("state")
        assert state is not None
        state.check_keys({"url", "url_env", "pool_size"})
        url = state.get("url", str)
        if (url_env := state.get("url_env", str)) is not None:
            if url is not None:
                raise state.fail("url_env", "state takes url or url_env, not both")
            if (problem := env_name_problem(url_env, "state.url_env", "the URL")) is not None:
                raise state.fail("url_env", problem)
            url = env.get(url_env) or None
            if url is None:
                raise state.fail("url_env", f"environment variable {url_env} is missing or empty")
        pool_size = state.get("pool_size", int, default=pool_size)
        if not 1 <= pool_size <= 1000:
            raise state.fail("pool_size", "state.pool_size must be between 1 and 1000")
    if not isinstance(url, str) or not _URL_RE.fullmatch(url):
        raise top.fail("state", "state must be a postgresql:// URL (a SQLite file is state_path)")
    replica = top.child("replica")
    if replica is None:
        raise top.fail("state", "state on PostgreSQL needs a replica section with its keys (replica.keys)")
    replica.check_keys({"id", "keys"})
    replica_id = replica.get("id", str)
    if replica_id is not None and not _REPLICA_RE.fullmatch(replica_id):
        raise replica.fail("id", "replica.id must match [A-Za-z0-9._-]{1,64}")
    keys = replica.child("keys")
    if keys is None:
        raise replica.fail(None, "replica.keys is required: approval_binding and request_state key rings")
    keys.check_keys({"approval_binding", "request_state"})
    return SharedState(
        url=url, pool_size=pool_size, replica_id=replica_id,
        binding_keys=_ring(keys, "approval_binding", env), request_state_keys=_ring(keys, "request_state", env),
    )


def state_env_names(top: Reader) -> frozenset[str]:
    """The variables ``state`` and ``replica`` read a credential from (``url_env``, each key ring
    entry's ``env``), for a section ``state_section`` has accepted: none of them may reach a child."""
    names: set[str] = set()
    state, replica = top.node.get("state"), top.node.get("replica")
    if isinstance(state, Mapping) and isinstance(state.get("url_env"), str):
        names.add(state["url_env"])
    keys = replica.get("keys") if isinstance(replica, Mapping) else None
    for ring in keys.values() if isinstance(keys, Mapping) else ():
        names.update(entry["env"] for entry in ring or () if isinstance(entry, Mapping) and isinstance(entry.get("env"), str))
    return frozenset(names)


__all__ = [
    "MIN_KEY_BYTES", "URL_AS_PATH", "RingKey", "SharedState", "looks_like_url", "state_env_names", "state_file",
    "state_section",
]
