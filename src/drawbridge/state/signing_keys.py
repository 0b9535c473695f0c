"""The gateway's two Ed25519 keys: one signs trace checkpoints, the other attestations of exports.

Invariant: a private key exists only in its PKCS#8 PEM file, mode 0600, in a directory of mode
0700, and in the memory of the process that loaded it; no record, log line, error message or export
holds it (``repr`` hides it, and every error names the file, never its content). A key file that
group or others may read is refused, as ssh refuses one. The two keys are never the same (C2SP: a
key is not reused across signature types), and each public file is the public half of its private
key (a swapped key file is refused when the keys are loaded). A log keeps its origin: keys that sign
as another origin than the one the existing trace was signed under are refused (``open_keys``).

Files in the keys directory (default ``<evidence_dir>/keys``), made together at first start:

- ``checkpoint.key``: PKCS#8 PEM, signs checkpoints as the log's origin;
- ``checkpoint.vkey``: its C2SP verifier key ``<origin>+<key hash>+<base64>``, which also records the
  origin (default ``drawbridge.local/<128-bit random hex>``): print it, pin it elsewhere;
- ``attestation.key``: PKCS#8 PEM (the format of Assay's key files), signs DSSE envelopes;
- ``attestation.pub.pem``: its SubjectPublicKeyInfo PEM.

A gateway makes and reads its keys without ``cryptography`` (``drawbridge.evidence.ed25519_seed``: the
PEM it writes is the one ``cryptography`` writes, byte for byte); a key file in any other PKCS#8 form,
and every public-key object handed out (``attestation``, ``read_public_pem``), goes through
``cryptography`` as before, imported when first needed.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Final

from drawbridge.evidence.ed25519_seed import (
    SEED_BYTES,
    SeedKey,
    pkcs8_pem,
    seed_of_pkcs8_pem,
    spki_der_of,
    spki_pem,
)
from drawbridge.evidence.signed_note import NoteError, NoteSigner, NoteVerifier, note_signatures, parse_vkey
from drawbridge.evidence.tlog import DEFAULT_ORIGIN_DOMAIN, is_valid_origin

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

KEYS_DIR: Final = "keys"
CHECKPOINT_KEY: Final = "checkpoint.key"
CHECKPOINT_VKEY: Final = "checkpoint.vkey"
ATTESTATION_KEY: Final = "attestation.key"
ATTESTATION_PUB: Final = "attestation.pub.pem"
KEY_MODE: Final = 0o600
DIR_MODE: Final = 0o700


class KeyFileError(Exception):
    """A key file that cannot be made, read or trusted; the message names the file, never its content."""


def default_origin() -> str:
    return f"{DEFAULT_ORIGIN_DOMAIN}/{secrets.token_hex(16)}"


def spki_der(key: Ed25519PublicKey) -> bytes:
    return spki_der_of(key.public_bytes_raw())


def dsse_keyid(key: Ed25519PublicKey) -> str:
    """Assay's DSSE key id: ``sha256:`` + hex SHA-256 of the SubjectPublicKeyInfo DER."""
    return _keyid(spki_der(key))


def _keyid(der: bytes) -> str:
    return "sha256:" + hashlib.sha256(der).hexdigest()


@dataclass(frozen=True)
class EvidenceKeys:
    directory: Path
    checkpoint: NoteSigner = field(repr=False)
    attestation_seed: SeedKey = field(repr=False)

    @property
    def origin(self) -> str:
        return self.checkpoint.name

    @property
    def verifier(self) -> NoteVerifier:
        return self.checkpoint.verifier

    @cached_property
    def attestation(self) -> Ed25519PrivateKey:
        """The attestation key as ``cryptography``'s key, for DSSE (exports only: imported then)."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        return Ed25519PrivateKey.from_private_bytes(self.attestation_seed.private_bytes_raw())

    @property
    def attestation_public_pem(self) -> bytes:
        return spki_pem(self.attestation_seed.public_key().public_bytes_raw())

    @property
    def attestation_keyid(self) -> str:
        return _keyid(spki_der_of(self.attestation_seed.public_key().public_bytes_raw()))


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Write a file that must not exist yet: to a temporary name, fsynced, then linked into place (a crash
    leaves no half-written key under the real name)."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(temporary, path)
    finally:
        temporary.unlink()


def _read_private(path: Path) -> SeedKey:
    try:
        info = os.stat(path)
    except OSError as exc:
        raise KeyFileError(f"cannot read the key file {path}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise KeyFileError(f"the key file {path} is not a regular file")
    if info.st_mode & 0o077:
        raise KeyFileError(
            f"the key file {path} may be read by others (mode {stat.S_IMODE(info.st_mode):04o}); "
            f"it must be {KEY_MODE:04o} (chmod 600)"
        )
    try:
        data = path.read_bytes()
    except OSError:
        raise KeyFileError(f"the key file {path} is not an unencrypted PKCS#8 PEM private key") from None
    seed = seed_of_pkcs8_pem(data)
    return SeedKey(seed if seed is not None else _seed_of_other_pem(path, data))


def _seed_of_other_pem(path: Path, data: bytes) -> bytes:
    """A key file in another form than the one drawbridge writes, read (or refused) by ``cryptography``."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise KeyFileError(f"the key file {path} is not an unencrypted PKCS#8 PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"the key file {path} does not hold an Ed25519 key")
    return key.private_bytes_raw()


def _create(directory: Path, origin: str) -> None:
    checkpoint, attestation = secrets.token_bytes(SEED_BYTES), secrets.token_bytes(SEED_BYTES)
    signer = NoteSigner(origin, SeedKey(checkpoint))
    _write_new(directory / CHECKPOINT_KEY, pkcs8_pem(checkpoint), KEY_MODE)
    _write_new(directory / ATTESTATION_KEY, pkcs8_pem(attestation), KEY_MODE)
    attestation_public = SeedKey(attestation).public_key().public_bytes_raw()
    _write_new(directory / ATTESTATION_PUB, spki_pem(attestation_public), 0o644)
    _write_new(directory / CHECKPOINT_VKEY, (signer.verifier.vkey + "\n").encode("ascii"), 0o644)
    for name in (None, CHECKPOINT_KEY):
        fd = os.open(directory if name is None else directory / name, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def load_keys(directory: str | os.PathLike[str]) -> EvidenceKeys:
    """The keys of a directory made by ``open_keys``; ``KeyFileError`` when one is missing or wrong."""
    path = Path(directory)
    verifier = read_vkey(path / CHECKPOINT_VKEY)
    signer = NoteSigner(verifier.name, _read_private(path / CHECKPOINT_KEY))
    if signer.verifier != verifier:
        raise KeyFileError(f"{path / CHECKPOINT_VKEY} is not the verifier key of {path / CHECKPOINT_KEY}")
    attestation = _read_private(path / ATTESTATION_KEY)
    if attestation.private_bytes_raw() == signer.key.private_bytes_raw():
        raise KeyFileError(f"{path / ATTESTATION_KEY} is the checkpoint key: the two keys must differ")
    _check_public_half(path / ATTESTATION_PUB, attestation, path / ATTESTATION_KEY)
    return EvidenceKeys(path, signer, attestation)


def _check_public_half(public_path: Path, private: SeedKey, private_path: Path) -> None:
    """The published public key must be the private key's own: an attestation an auditor checks with
    ``attestation.pub.pem`` is signed by ``attestation.key``, never by a key swapped in beside it. The file
    drawbridge writes is compared byte for byte (no ``cryptography`` needed); another PEM form is read."""
    public = private.public_key().public_bytes_raw()
    try:
        data = public_path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"cannot read the public key {public_path}: {exc.strerror}") from None
    if data != spki_pem(public) and read_public_pem(public_path).public_bytes_raw() != public:
        raise KeyFileError(f"{public_path} is not the public key of {private_path}")


def refuse_other_origin(keys_dir: Path, keys_origin: str | None, log_origins: Sequence[str]) -> None:
    """A log keeps its origin: keys (or keys about to be made, ``keys_origin`` None) that would sign the
    trace as another origin than the one it was signed under are refused, naming both origins."""
    for log_origin in log_origins:
        if keys_origin is None:
            raise KeyFileError(
                f"{keys_dir} holds no keys, but the trace was signed as origin {log_origin!r}: a log keeps its "
                "origin (give that log's keys directory, or another evidence directory for a new log)"
            )
        if log_origin != keys_origin:
            raise KeyFileError(
                f"the keys in {keys_dir} sign as origin {keys_origin!r}, but the trace was signed as origin "
                f"{log_origin!r}: a log keeps its origin (give that log's keys directory, or another evidence "
                "directory for a new log)"
            )


def refuse_other_key(keys_dir: Path, keys: EvidenceKeys, latest_note: bytes) -> None:
    """A log keeps its keys: a checkpoint key of the log's origin that is not the one which signed the
    latest checkpoint (another key pair, made with the same ``origin``) would sign a log no single key
    verifies. Told by the key hash the note's signature line names; a note that cannot be read is left
    to the verifier, which reports it."""
    if not latest_note:
        return
    try:
        signatures = note_signatures(latest_note)
    except NoteError:
        return
    ours = [signature for signature in signatures if signature.name == keys.origin]
    if ours and all(signature.key_hash != keys.verifier.key_hash for signature in ours):
        raise KeyFileError(
            f"the checkpoint key in {keys_dir} (key hash {keys.verifier.key_hash:08x}) is not the one that "
            f"signed the trace's latest checkpoint as origin {keys.origin!r} (key hash "
            f"{ours[0].key_hash:08x}): a log keeps its keys (give that log's keys directory, or another "
            "evidence directory for a new log)"
        )


def open_keys(
    directory: str | os.PathLike[str],
    origin: str | None = None,
    log_origins: Sequence[str] = (),
    latest_note: bytes = b"",
) -> EvidenceKeys:
    """The keys of ``directory``, made there (with ``origin``, else a random one) when it holds none.
    A log's origin does not change: a configured ``origin`` other than the keys' own is refused, and so
    are keys (or none, to be made) signing as another origin than ``log_origins``, the origins the
    existing trace was signed under (``checkpoint_files.log_origins``), and keys of the log's origin
    whose key hash is not the one that signed ``latest_note``, its latest checkpoint."""
    path = Path(directory)
    if origin is not None and not is_valid_origin(origin):
        raise KeyFileError(f"the origin {origin!r} is not a key name (printable ASCII, no spaces, no '+')")
    try:
        path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        if not (path / CHECKPOINT_KEY).exists() and not (path / CHECKPOINT_VKEY).exists():
            refuse_other_origin(path, None, log_origins)
            _create(path, origin or default_origin())
    except OSError as exc:
        raise KeyFileError(f"cannot make the keys in {path}: {exc.strerror or exc}") from None
    keys = load_keys(path)
    if origin is not None and origin != keys.origin:
        raise KeyFileError(
            f"the keys in {path} sign as origin {keys.origin!r}, not {origin!r}: a log keeps its origin "
            "(give the keys' own origin, or another keys directory for a new log)"
        )
    refuse_other_origin(path, keys.origin, log_origins)
    refuse_other_key(path, keys, latest_note)
    return keys


def read_vkey(path: str | os.PathLike[str]) -> NoteVerifier:
    """A verifier key file (one line)."""
    try:
        text = Path(path).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not ASCII"
        raise KeyFileError(f"cannot read the verifier key {path}: {reason}") from None
    try:
        return parse_vkey(text.strip())
    except NoteError as exc:
        raise KeyFileError(f"{path}: {exc}") from None


def read_public_pem(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    """An Ed25519 SubjectPublicKeyInfo PEM file, through ``cryptography``."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        key = load_pem_public_key(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not a PEM public key"
        raise KeyFileError(f"cannot read the public key {path}: {reason}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{path} is not an Ed25519 public key")
    return key


__all__ = [
    "ATTESTATION_KEY",
    "ATTESTATION_PUB",
    "CHECKPOINT_KEY",
    "CHECKPOINT_VKEY",
    "KEYS_DIR",
    "EvidenceKeys",
    "KeyFileError",
    "default_origin",
    "dsse_keyid",
    "load_keys",
    "open_keys",
    "read_public_pem",
    "read_vkey",
    "refuse_other_key",
    "refuse_other_origin",
    "spki_der",
]
