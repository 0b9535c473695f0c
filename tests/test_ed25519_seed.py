"""The checkpoint key signs through libsodium, and what it writes and signs is what ``cryptography`` would:
the same signature bytes over the same note, the same PEM files; key files in other PKCS#8 forms are
still read (by ``cryptography``), and what is not an Ed25519 key is still refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from drawbridge.evidence.ed25519_seed import SeedKey, pkcs8_pem, seed_of_pkcs8_pem, spki_pem
from drawbridge.evidence.merkle import MerkleTree, leaf_hash
from drawbridge.evidence.signed_note import NoteSigner, open_note, sign_note
from drawbridge.evidence.tlog import Checkpoint, open_checkpoint, sign_checkpoint
from drawbridge.state.signing_keys import KeyFileError, dsse_keyid, load_keys, open_keys, read_public_pem

seeds = st.binary(min_size=32, max_size=32)


@settings(max_examples=200, deadline=None)
@given(seed=seeds, message=st.binary(max_size=512))
def test_a_seed_signs_what_cryptography_signs_and_writes_its_pem(seed: bytes, message: bytes) -> None:
    ours, theirs = SeedKey(seed), Ed25519PrivateKey.from_private_bytes(seed)
    assert ours.sign(message) == theirs.sign(message)
    theirs.public_key().verify(ours.sign(message), message)
    assert ours.public_key().public_bytes_raw() == theirs.public_key().public_bytes_raw()
    assert ours.private_bytes_raw() == seed
    written = theirs.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    assert pkcs8_pem(seed) == written and seed_of_pkcs8_pem(written) == seed
    public = theirs.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    assert spki_pem(ours.public_key().public_bytes_raw()) == public


def test_a_checkpoint_signed_through_libsodium_is_the_one_cryptography_signs_and_verifies() -> None:
    seed = bytes(range(32))
    tree = MerkleTree([leaf_hash(line) for line in (b"one", b"two", b"three")])
    checkpoint = Checkpoint("example.com/log", tree.size, tree.root())
    ours = sign_checkpoint(checkpoint, NoteSigner("example.com/log", SeedKey(seed)))
    theirs = sign_checkpoint(checkpoint, NoteSigner("example.com/log", Ed25519PrivateKey.from_private_bytes(seed)))
    assert ours == theirs
    signer = NoteSigner("example.com/log", SeedKey(seed))
    assert open_checkpoint(ours, signer.verifier) == checkpoint
    assert open_note(sign_note("a note\n", [signer]), [signer.verifier]).text == "a note\n"
    assert repr(signer) == "NoteSigner(name='example.com/log')" and repr(signer.key) == "SeedKey(...)"


def test_seed_of_pkcs8_pem_takes_only_the_exact_text_it_writes() -> None:
    written = pkcs8_pem(b"\x05" * 32)
    for other in (written.replace(b"\n", b"\r\n"), written + b"\n", b" " + written[1:], written[:-1],
                  written.replace(b"PRIVATE KEY", b"EC PRIVATE KEY"), written.replace(b"MC4C", b"MC5C")):
        assert seed_of_pkcs8_pem(other) is None


def _write_key(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def test_key_files_in_other_forms_are_read_by_cryptography_and_wrong_ones_refused(tmp_path: Path) -> None:
    keys = open_keys(tmp_path / "keys", "example.com/gw")
    checkpoint = tmp_path / "keys" / "checkpoint.key"
    seed = keys.checkpoint.key.private_bytes_raw()
    assert checkpoint.read_bytes() == pkcs8_pem(seed)
    assert read_public_pem(tmp_path / "keys" / "attestation.pub.pem").public_bytes_raw() == (
        keys.attestation.public_key().public_bytes_raw())
    assert keys.attestation_keyid == dsse_keyid(keys.attestation.public_key())
    _write_key(checkpoint, pkcs8_pem(seed).replace(b"\n", b"\r\n"))  # another PEM text of the same key
    again = load_keys(tmp_path / "keys")
    assert again.checkpoint.key.private_bytes_raw() == seed and again.verifier == keys.verifier
    key = Ed25519PrivateKey.from_private_bytes(seed)
    _write_key(checkpoint, key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, BestAvailableEncryption(b"pass")))
    with pytest.raises(KeyFileError, match="is not an unencrypted PKCS#8 PEM private key"):
        load_keys(tmp_path / "keys")
    other = generate_private_key(SECP256R1()).private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    _write_key(checkpoint, other)
    with pytest.raises(KeyFileError, match="does not hold an Ed25519 key"):
        load_keys(tmp_path / "keys")
