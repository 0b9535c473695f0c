"""Which keys the replicas on one database use: the key ring's fingerprints, held in common.

Invariant: every replica on a shared database seals ``requestState`` tokens and binds approvals
under the same keys. The database keeps, per purpose and key id, a fingerprint of the key (an
HMAC of a fixed label under the key: it shows whether two keys are equal and nothing else); a
replica starts only when each key id it has is either unknown to the database or has the same
fingerprint, and, for each purpose the database knows, it shares at least one key id with it.
Otherwise it refuses to start (``KeyRingMismatch``), naming the purpose and key id, never a key.
A rotation adds the new key beside the old one on every replica first (shared id), then retires
the old one.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from drawbridge.state.backend import StateBackend
from drawbridge.state.sqlite import StateError, to_db_time

FINGERPRINT_LABEL: Final = b"drawbridge.key_ring.fingerprint.v1"


class KeyRingMismatch(StateError):
    """This replica's keys differ from those the other replicas on the database use."""


def fingerprint(purpose: str, key_id: str, key: bytes) -> str:
    message = FINGERPRINT_LABEL + b":" + purpose.encode() + b":" + key_id.encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def check_and_register(
    db: StateBackend, rings: Mapping[str, Sequence[tuple[str, bytes]]], *, by: str, at: datetime
) -> None:
    """Refuse (``KeyRingMismatch``) keys that differ from the database's; record the new ones."""
    when = to_db_time(at)

    def check(conn: Any) -> None:
        for purpose, ring in rings.items():
            known = dict(
                conn.execute("SELECT key_id, fingerprint FROM key_ring WHERE purpose = ?", (purpose,)).fetchall()
            )
            mine = {key_id: fingerprint(purpose, key_id, key) for key_id, key in ring}
            for key_id, print_ in mine.items():
                if key_id in known and not hmac.compare_digest(known[key_id], print_):
                    raise KeyRingMismatch(
                        f"the {purpose} key {key_id!r} differs from the key of that id the other replicas on "
                        f"{db.label} use; every replica must be given the same key ring"
                    )
            if known and not set(known) & set(mine):
                raise KeyRingMismatch(
                    f"none of this replica's {purpose} key ids ({', '.join(sorted(mine))}) is among those the "
                    f"other replicas on {db.label} use ({', '.join(sorted(known))}); every replica must be "
                    "given the same key ring (rotate by adding the new key beside the old one)"
                )
            for key_id, print_ in mine.items():
                if key_id not in known:
                    conn.execute(
                        "INSERT INTO key_ring (purpose, key_id, fingerprint, first_seen, first_by) "
                        "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                        (purpose, key_id, print_, when, by),
                    )

    db.write_sync(check, "check the key ring")


__all__ = ["KeyRingMismatch", "check_and_register", "fingerprint"]
