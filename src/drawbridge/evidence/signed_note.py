"""C2SP signed notes with Ed25519 (signature type 0x01): sign, open, and the key encodings.

Invariant: a note this module signs is one ``golang.org/x/mod/sumdb/note.Open`` accepts, and
``open_note`` accepts exactly what that ``Open`` accepts: UTF-8 text with no control character but
``\\n``, ending in ``\\n``, then a blank line, then signature lines ``— <name> <base64(key hash (4
bytes, big-endian) || signature)>``. A signature by a known key (name and key hash) that does not
verify rejects the whole note; signatures by unknown keys are kept aside as unverified; a note with
no verified signature is refused. The key hash is ``SHA-256(name || "\\n" || 0x01 || public key)[:4]``.

Key encodings (C2SP signed-note, and Go's): the verifier key ``<name>+<8 hex key hash>+<base64(0x01 ||
public key)>``, printed for auditors to pin; Go's signer key ``PRIVATE+KEY+<name>+<hash>+<base64(0x01
|| seed)>`` is read (for interoperability and the package documentation's example) but never written:
drawbridge keeps its private keys as PKCS#8 PEM files, outside every record.

Signing goes through ``drawbridge.evidence.ed25519_seed`` (libsodium: a gateway signs all run long);
verifying imports ``cryptography`` the first time a signature is checked.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from drawbridge.canonical import RUST_WHITESPACE
from drawbridge.evidence.ed25519_seed import SeedKey, SignatureKey

ALG_ED25519: Final = 0x01
SIGNATURE_PREFIX: Final = "\u2014 "
MAX_SIGNATURES: Final = 100
"""Go's ``Open`` refuses a note with more signature lines; so does ``open_note``."""


class NoteError(ValueError):
    """A note, key or signature that cannot be used; the message says which and why."""


class MalformedNote(NoteError):
    pass


class InvalidNoteSignature(NoteError):
    """A known key's signature does not verify: the whole note is refused."""


class UnverifiedNote(NoteError):
    """A well-formed note with no signature by a known key."""


def is_valid_key_name(name: str) -> bool:
    """Non-empty, no Unicode space, no ``+`` (Go's ``isValidName``)."""
    return bool(name) and "+" not in name and not any(char in RUST_WHITESPACE for char in name)


def key_hash(name: str, encoded_public_key: bytes) -> int:
    """The 32-bit key hash of a name and its ``0x01 || public key``."""
    digest = hashlib.sha256(name.encode("utf-8") + b"\n" + encoded_public_key).digest()
    return int.from_bytes(digest[:4], "big")


@dataclass(frozen=True)
class NoteVerifier:
    """A known Ed25519 key: the name its signature lines carry, its key hash, the key."""

    name: str
    key_hash: int
    public_key: bytes

    def verify(self, message: bytes, signature: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        try:
            Ed25519PublicKey.from_public_bytes(self.public_key).verify(signature, message)
        except (InvalidSignature, ValueError):
            return False
        return True

    @property
    def vkey(self) -> str:
        encoded = base64.b64encode(bytes([ALG_ED25519]) + self.public_key).decode("ascii")
        return f"{self.name}+{self.key_hash:08x}+{encoded}"


@dataclass(frozen=True)
class NoteSigner:
    """An Ed25519 private key and the name it signs as (never rendered: see the module docstring)."""

    name: str
    key: SignatureKey = field(repr=False)

    def __post_init__(self) -> None:
        if not is_valid_key_name(self.name):
            raise NoteError("a key name must be non-empty, without spaces and without '+'")

    @property
    def verifier(self) -> NoteVerifier:
        public = self.key.public_key().public_bytes_raw()
        return NoteVerifier(self.name, key_hash(self.name, bytes([ALG_ED25519]) + public), public)


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise NoteError(f"{what} is not standard base64") from None


def parse_vkey(vkey: str) -> NoteVerifier:
    """A verifier key ``<name>+<hash>+<base64(0x01 || key)>``; refuses any other form, algorithm or hash."""
    name, _, rest = vkey.strip("\n").partition("+")
    hash_hex, _, key_b64 = rest.partition("+")
    if not is_valid_key_name(name) or len(hash_hex) != 8 or not all(c in "0123456789abcdefABCDEF" for c in hash_hex):
        raise NoteError("a verifier key reads <name>+<8 hex digits>+<base64 key>")
    key = _b64(key_b64, "the verifier key's key")
    if not key:
        raise NoteError("the verifier key holds no key")
    if int(hash_hex, 16) != key_hash(name, key):
        raise NoteError("the verifier key's hash does not match its name and key")
    if key[0] != ALG_ED25519:
        raise NoteError(f"the verifier key's algorithm {key[0]} is not Ed25519 (1)")
    if len(key) != 33:
        raise NoteError("an Ed25519 verifier key holds 32 bytes")
    return NoteVerifier(name, int(hash_hex, 16), key[1:])


def parse_skey(skey: str) -> NoteSigner:
    """Go's signer key ``PRIVATE+KEY+<name>+<hash>+<base64(0x01 || seed)>`` (read, never written)."""
    parts = skey.strip("\n").split("+", 4)
    if len(parts) != 5 or parts[0] != "PRIVATE" or parts[1] != "KEY" or len(parts[3]) != 8:
        raise NoteError("a signer key reads PRIVATE+KEY+<name>+<8 hex digits>+<base64 key>")
    name, hash_hex = parts[2], parts[3]
    key = _b64(parts[4], "the signer key's key")
    if len(key) != 33 or key[0] != ALG_ED25519:
        raise NoteError("the signer key is not an Ed25519 seed")
    signer = NoteSigner(name, SeedKey(key[1:]))
    if int(hash_hex, 16) != signer.verifier.key_hash:
        raise NoteError("the signer key's hash does not match its name and key")
    return signer


def _check_text(text: str) -> None:
    if not text.endswith("\n"):
        raise MalformedNote("a note's text ends with a newline")
    if text.endswith("\n\n") or text == "\n":
        raise MalformedNote("a note's text does not end with a blank line")
    if any(ord(char) < 0x20 and char != "\n" for char in text):
        raise MalformedNote("a note's text holds a control character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise MalformedNote("a note's text is not Unicode text") from None


def sign_note(text: str, signers: Sequence[NoteSigner]) -> str:
    """The signed note: ``text``, a blank line, one signature line per signer."""
    _check_text(text)
    if not signers:
        raise NoteError("a note needs at least one signer")
    message = text.encode("utf-8")
    lines = []
    for signer in signers:
        verifier = signer.verifier
        signature = signer.key.sign(message)
        encoded = base64.b64encode(verifier.key_hash.to_bytes(4, "big") + signature).decode("ascii")
        lines.append(f"{SIGNATURE_PREFIX}{signer.name} {encoded}\n")
    return text + "\n" + "".join(lines)


@dataclass(frozen=True)
class NoteSignature:
    name: str
    key_hash: int
    base64: str


@dataclass(frozen=True)
class OpenedNote:
    text: str
    verified: tuple[NoteSignature, ...]
    unverified: tuple[NoteSignature, ...]


def _split(message: bytes | str) -> tuple[bytes, list[tuple[NoteSignature, bytes]]]:
    """The note's text and its signature lines (each with its raw key hash and signature), read by
    the format rules alone: nothing is verified here."""
    if isinstance(message, str):
        try:
            data = message.encode("utf-8")
        except UnicodeEncodeError:
            raise MalformedNote("the note is not Unicode text") from None
    else:
        data = bytes(message)
    try:
        decoded = data.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedNote("the note is not valid UTF-8") from None
    if any(ord(char) < 0x20 and char != "\n" for char in decoded):
        raise MalformedNote("the note holds a control character")
    split = data.rfind(b"\n\n")
    if split < 0:
        raise MalformedNote("the note has no blank line before its signatures")
    text, block = data[: split + 1], data[split + 2 :]
    if not block or not block.endswith(b"\n"):
        raise MalformedNote("the note's signature block does not end with a newline")
    lines = block[:-1].decode("utf-8").split("\n")
    if len(lines) > MAX_SIGNATURES:
        raise MalformedNote(f"the note has more than {MAX_SIGNATURES} signatures")
    signatures: list[tuple[NoteSignature, bytes]] = []
    for line in lines:
        if not line.startswith(SIGNATURE_PREFIX):
            raise MalformedNote("a signature line does not start with an em dash and a space")
        body = line[len(SIGNATURE_PREFIX) :]
        name, _, encoded = body.partition(" ")
        try:
            raw = base64.b64decode(encoded.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError, ValueError):
            raise MalformedNote("a signature is not standard base64") from None
        if not is_valid_key_name(name) or not encoded or len(raw) < 5:
            raise MalformedNote("a signature line is not <name> <base64 signature>")
        signatures.append((NoteSignature(name, int.from_bytes(raw[:4], "big"), encoded), raw))
    return text, signatures


def note_signatures(message: bytes | str) -> tuple[NoteSignature, ...]:
    """Who signed the note, by name and key hash, as its lines say (no signature is verified: for
    telling which key a note claims, e.g. whether a log's keys are still the ones that signed it)."""
    return tuple(signature for signature, _raw in _split(message)[1])


def open_note(message: bytes | str, known: Iterable[NoteVerifier]) -> OpenedNote:
    """The note's text once a known key's signature verifies (module docstring for every rule)."""
    text, signatures = _split(message)
    keys: dict[tuple[str, int], list[NoteVerifier]] = {}
    for verifier in known:
        keys.setdefault((verifier.name, verifier.key_hash), []).append(verifier)
    verified: list[NoteSignature] = []
    unverified: list[NoteSignature] = []
    seen: set[tuple[str, int]] = set()
    seen_unverified: set[tuple[str, str]] = set()
    for signature, raw in signatures:
        name, hash_value = signature.name, signature.key_hash
        candidates = keys.get((name, hash_value))
        if candidates is None:
            if (name, signature.base64) not in seen_unverified:
                seen_unverified.add((name, signature.base64))
                unverified.append(signature)
            continue
        if len(candidates) > 1:
            raise NoteError(f"two known keys share the name {name} and key hash {hash_value:08x}")
        if (name, hash_value) in seen:
            continue
        seen.add((name, hash_value))
        if not candidates[0].verify(text, raw[4:]):
            raise InvalidNoteSignature(f"the signature of {name}+{hash_value:08x} does not verify")
        verified.append(signature)
    if not verified:
        raise UnverifiedNote("the note carries no signature by a known key")
    return OpenedNote(text.decode("utf-8"), tuple(verified), tuple(unverified))


__all__ = [
    "ALG_ED25519",
    "InvalidNoteSignature",
    "MalformedNote",
    "NoteError",
    "NoteSignature",
    "NoteSigner",
    "NoteVerifier",
    "OpenedNote",
    "UnverifiedNote",
    "is_valid_key_name",
    "key_hash",
    "note_signatures",
    "open_note",
    "parse_skey",
    "parse_vkey",
    "sign_note",
]
