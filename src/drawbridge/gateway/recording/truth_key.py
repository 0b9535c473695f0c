"""The truth producer's key material, read once from the environment and held only in memory.

Invariant: when the producer is enabled, the gateway starts only with a usable
key (at least ``MIN_KEY_BYTES`` UTF-8 bytes, the floor of the argument digest key too:
a shorter key makes every ``args_digest`` brute-forceable offline) and key id, and neither reaches the upstream's environment, a record, a log
line or an error message (evidence-formats.md §2.10, tool-decision-truth.md).

Names: ``DRAWBRIDGE_TDT_HMAC_KEY`` and ``DRAWBRIDGE_TDT_HMAC_KEY_ID``; for
drop-in compatibility ``ASSAY_TDT_HMAC_KEY`` and ``ASSAY_TDT_HMAC_KEY_ID`` are read
when the drawbridge names are absent. A pair is taken from one family only: a
key from one and an id from the other is refused, so a half-migrated
environment cannot mint carriers under the wrong id.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import MutableMapping
from dataclasses import dataclass

from drawbridge.canonical import is_valid_key_id

FAMILIES = (
    ("DRAWBRIDGE_TDT_HMAC_KEY", "DRAWBRIDGE_TDT_HMAC_KEY_ID"),
    ("ASSAY_TDT_HMAC_KEY", "ASSAY_TDT_HMAC_KEY_ID"),
)
ALL_NAMES = tuple(name for family in FAMILIES for name in family)
DIGEST_KEY_ENV = "DRAWBRIDGE_ARGS_DIGEST_KEY"
DIGEST_KEY_ID_ENV = "DRAWBRIDGE_ARGS_DIGEST_KEY_ID"
DIGEST_KEY_FILE_ENV = "DRAWBRIDGE_ARGS_DIGEST_KEY_FILE"
DIGEST_NAMES = (DIGEST_KEY_ENV, DIGEST_KEY_ID_ENV, DIGEST_KEY_FILE_ENV)
MIN_KEY_BYTES = 32  # of either key: 256 bits, the size of an HMAC-SHA256 output


class TruthKeyError(ValueError):
    """The producer is enabled but its key material is unusable (never quotes the key)."""


@dataclass(frozen=True)
class TruthKey:
    """The HMAC key of ``args_digest`` and its id; ``repr`` never shows the key."""

    key: bytes
    key_id: str

    def __repr__(self) -> str:
        return f"TruthKey(key_id={self.key_id!r}, key=<{len(self.key)} bytes>)"


def ephemeral_key() -> TruthKey:
    """A random key for this process alone (key id ``ephemeral-<8 hex>``): digests correlate calls within
    one run and cannot be brute-forced offline."""
    return TruthKey(secrets.token_bytes(32), f"ephemeral-{secrets.token_hex(4)}")


def truth_key_from_env(environ: MutableMapping[str, str] | None = None) -> TruthKey:
    """Read the key pair and REMOVE every key variable from ``environ`` (default ``os.environ``).

    Removal happens whether or not the pair is usable, before any child is spawned.
    """
    environ = os.environ if environ is None else environ
    values = {name: environ.get(name) for name in ALL_NAMES}
    for name in ALL_NAMES:
        environ.pop(name, None)
    family = next((f for f in FAMILIES if values[f[0]] is not None or values[f[1]] is not None), FAMILIES[0])
    key_name, id_name = family
    key, key_id = values[key_name], values[id_name]
    other = [name for name in ALL_NAMES if name not in family and values[name] is not None]
    if other:
        raise TruthKeyError(f"{key_name}/{id_name} and {', '.join(other)} are both set; set one pair only")
    if key is None:
        raise TruthKeyError(f"{key_name} is missing: the tool-decision truth producer needs an HMAC key")
    if key == "":
        raise TruthKeyError(f"{key_name} is empty")
    if len(key.encode("utf-8")) < MIN_KEY_BYTES:
        raise TruthKeyError(f"{key_name} is too short: it must hold at least {MIN_KEY_BYTES} bytes")
    if key_id is None:
        raise TruthKeyError(f"{id_name} is missing")
    if not is_valid_key_id(key_id):
        raise TruthKeyError(f"{id_name} is malformed: it must be non-empty and only [A-Za-z0-9._-]")
    return TruthKey(key.encode("utf-8"), key_id)


def _key_file(path: str) -> TruthKey:
    """A key file: the key id on its first line, the key as hex on its second; readable by its owner only."""
    try:
        if os.stat(path).st_mode & 0o077:
            raise TruthKeyError(f"{DIGEST_KEY_FILE_ENV}: {path} is readable by others: chmod 600 it")
        with open(path, encoding="ascii") as file:
            lines = file.read().split()
    except (OSError, UnicodeDecodeError) as exc:
        raise TruthKeyError(f"{DIGEST_KEY_FILE_ENV}: cannot read {path} ({type(exc).__name__})") from None
    if len(lines) != 2 or not is_valid_key_id(lines[0]):
        raise TruthKeyError(f"{DIGEST_KEY_FILE_ENV}: {path} must hold a key id line and a hex key line")
    try:
        key = bytes.fromhex(lines[1])
    except ValueError:
        raise TruthKeyError(f"{DIGEST_KEY_FILE_ENV}: the key in {path} is not hex") from None
    if len(key) < MIN_KEY_BYTES:
        raise TruthKeyError(f"{DIGEST_KEY_FILE_ENV}: the key in {path} is shorter than {MIN_KEY_BYTES} bytes")
    return TruthKey(key, lines[0])


def digest_key_from_env(environ: MutableMapping[str, str] | None = None) -> TruthKey | None:
    """The configured key of the trace's argument digests, or None (the recorder then makes an
    ephemeral one); every digest key variable is REMOVED from ``environ`` first, usable or not.

    ``DRAWBRIDGE_ARGS_DIGEST_KEY_FILE`` names a key file (``_key_file``); or ``DRAWBRIDGE_ARGS_DIGEST_KEY``
    (at least 32 bytes) and ``DRAWBRIDGE_ARGS_DIGEST_KEY_ID`` give the key itself.
    """
    environ = os.environ if environ is None else environ
    values = {name: environ.pop(name, None) for name in DIGEST_NAMES}
    file, key, key_id = values[DIGEST_KEY_FILE_ENV], values[DIGEST_KEY_ENV], values[DIGEST_KEY_ID_ENV]
    if file and (key or key_id):
        raise TruthKeyError(f"{DIGEST_KEY_FILE_ENV} and {DIGEST_KEY_ENV} are both set; set one")
    if file:
        return _key_file(file)
    if not key and not key_id:
        return None
    if not key or len(key.encode("utf-8")) < MIN_KEY_BYTES:
        raise TruthKeyError(f"{DIGEST_KEY_ENV} must hold at least {MIN_KEY_BYTES} bytes")
    if not key_id or not is_valid_key_id(key_id):
        raise TruthKeyError(f"{DIGEST_KEY_ID_ENV} is missing or malformed: it must be only [A-Za-z0-9._-]")
    return TruthKey(key.encode("utf-8"), key_id)
