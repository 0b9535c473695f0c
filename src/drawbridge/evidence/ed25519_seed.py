"""An Ed25519 private key held as its 32-byte seed, signing through libsodium (PyNaCl), and the two PEM
forms drawbridge writes its keys in.

Why not ``cryptography`` here: a running gateway signs a checkpoint every few seconds, so whatever signs
stays loaded for the whole run; ``cryptography`` maps its own OpenSSL (about 8.5 MiB resident), PyNaCl
its libsodium (about 1 MiB). Ed25519 signatures are deterministic (RFC 8032), so the same seed signs the
same message to the same 64 bytes in both, and every verifier (``cryptography``'s, Go's) accepts them.
``cryptography`` keeps what only rare paths do: verifying, DSSE attestations, reading a key file in
any PKCS#8 form other than the one below.

Invariant: ``pkcs8_pem`` and ``spki_pem`` are byte for byte what ``cryptography`` writes for the same
key (``Encoding.PEM`` with ``PrivateFormat.PKCS8`` and ``NoEncryption``, ``PublicFormat.
SubjectPublicKeyInfo``: RFC 8410's fixed DER), and ``seed_of_pkcs8_pem`` recognises exactly that text,
nothing else: a key file in another form is for the caller to read with ``cryptography``. The seed is
never rendered (``repr`` hides it).
"""

from __future__ import annotations

import base64
from typing import Final, Protocol

import nacl.signing

SEED_BYTES: Final = 32
PKCS8_PREFIX: Final = bytes.fromhex("302e020100300506032b657004220420")
"""RFC 8410's OneAsymmetricKey v1 for Ed25519, up to the 32-byte seed."""
SPKI_PREFIX: Final = bytes.fromhex("302a300506032b6570032100")
"""RFC 8410's SubjectPublicKeyInfo for Ed25519, up to the 32-byte public key."""


class PublicBytes(Protocol):
    def public_bytes_raw(self) -> bytes: ...


class SignatureKey(Protocol):
    """What signs a note: a ``SeedKey`` or ``cryptography``'s ``Ed25519PrivateKey``."""

    def sign(self, data: bytes) -> bytes: ...

    def private_bytes_raw(self) -> bytes: ...

    def public_key(self) -> PublicBytes: ...


class RawPublicKey:
    """An Ed25519 public key's 32 bytes."""

    __slots__ = ("_raw",)

    def __init__(self, raw: bytes) -> None:
        self._raw = raw

    def public_bytes_raw(self) -> bytes:
        return self._raw


class SeedKey:
    """An Ed25519 private key from its seed (see the module docstring for why libsodium)."""

    __slots__ = ("_key",)

    def __init__(self, seed: bytes) -> None:
        if len(seed) != SEED_BYTES:
            raise ValueError("an Ed25519 seed holds 32 bytes")
        self._key = nacl.signing.SigningKey(seed)

    def __repr__(self) -> str:
        return "SeedKey(...)"

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data).signature

    def private_bytes_raw(self) -> bytes:
        return bytes(self._key)

    def public_key(self) -> RawPublicKey:
        return RawPublicKey(bytes(self._key.verify_key))


def _pem(label: str, der: bytes) -> bytes:
    body = base64.b64encode(der)
    lines = b"".join(body[at : at + 64] + b"\n" for at in range(0, len(body), 64))
    return b"-----BEGIN " + label.encode() + b"-----\n" + lines + b"-----END " + label.encode() + b"-----\n"


def pkcs8_pem(seed: bytes) -> bytes:
    """The unencrypted PKCS#8 PEM of a seed."""
    return _pem("PRIVATE KEY", PKCS8_PREFIX + seed)


def seed_of_pkcs8_pem(data: bytes) -> bytes | None:
    """The seed of exactly the text ``pkcs8_pem`` writes, else None."""
    if len(data) != len(pkcs8_pem(bytes(SEED_BYTES))):
        return None
    lines = data.split(b"\n")
    try:
        der = base64.b64decode(lines[1], validate=True)
    except ValueError:
        return None
    if len(der) != len(PKCS8_PREFIX) + SEED_BYTES or not der.startswith(PKCS8_PREFIX):
        return None
    seed = der[len(PKCS8_PREFIX) :]
    return seed if pkcs8_pem(seed) == data else None


def spki_der_of(public: bytes) -> bytes:
    """The SubjectPublicKeyInfo DER of a raw public key."""
    return SPKI_PREFIX + public


def spki_pem(public: bytes) -> bytes:
    """The SubjectPublicKeyInfo PEM of a raw public key."""
    return _pem("PUBLIC KEY", spki_der_of(public))


__all__ = [
    "SEED_BYTES",
    "PublicBytes",
    "RawPublicKey",
    "SeedKey",
    "SignatureKey",
    "pkcs8_pem",
    "seed_of_pkcs8_pem",
    "spki_der_of",
    "spki_pem",
]
