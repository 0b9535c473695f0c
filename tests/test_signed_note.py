"""C2SP signed notes and tlog checkpoints: the golang.org/x/mod/sumdb/note documentation's example,
byte for byte, and every rule of its ``Open``."""

from __future__ import annotations

import base64
import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from drawbridge.evidence.merkle import MerkleTree, leaf_hash
from drawbridge.evidence.signed_note import (
    InvalidNoteSignature,
    MalformedNote,
    NoteError,
    NoteSigner,
    UnverifiedNote,
    open_note,
    parse_skey,
    parse_vkey,
    sign_note,
)
from drawbridge.evidence.tlog import (
    Checkpoint,
    CheckpointError,
    make_tlog_proof,
    open_checkpoint,
    parse_checkpoint_text,
    parse_tlog_proof,
    sign_checkpoint,
    trace_leaf,
    verify_tlog_proof,
)

# The example of the golang.org/x/mod/sumdb/note package documentation (golang/mod, sumdb/note/note.go,
# commit fe2ec04f7c3c3aa6fad97631aafcff6e49e2d1db), copied byte for byte.
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
GO_MESSAGE = (
    GO_TEXT
    + "\n"
    + "\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
)
GO_DOUBLY_SIGNED = GO_MESSAGE + (
    "\u2014 EnochRoot rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+vAF1aGrQ5ovTG01oOTGwnWLox33WWd1RvMc+QQ=\n"
)


def test_the_go_documentation_example_is_reproduced_byte_for_byte() -> None:
    signer = parse_skey(GO_SKEY)
    assert signer.name == "PeterNeumann"
    assert signer.verifier.vkey == GO_VKEY
    assert sign_note(GO_TEXT, [signer]) == GO_MESSAGE  # Ed25519 is deterministic: the same bytes
    opened = open_note(GO_MESSAGE.encode("utf-8"), [parse_vkey(GO_VKEY)])
    assert opened.text == GO_TEXT
    assert [(s.name, s.key_hash) for s in opened.verified] == [("PeterNeumann", 0xC74F20A3)]


def test_key_hash_and_vkey_are_the_c2sp_definitions() -> None:
    verifier = parse_vkey(GO_VKEY)
    encoded = base64.b64decode(GO_VKEY.split("+")[2])
    assert encoded[0] == 1 and encoded[1:] == verifier.public_key
    digest = hashlib.sha256(b"PeterNeumann\n" + encoded).digest()
    assert int.from_bytes(digest[:4], "big") == verifier.key_hash == 0xC74F20A3


def test_an_unknown_second_signature_is_kept_aside_and_a_note_by_no_known_key_is_refused() -> None:
    opened = open_note(GO_DOUBLY_SIGNED, [parse_vkey(GO_VKEY)])
    assert [s.name for s in opened.verified] == ["PeterNeumann"]
    assert [s.name for s in opened.unverified] == ["EnochRoot"]
    other = NoteSigner("PeterNeumann", Ed25519PrivateKey.from_private_bytes(b"\x07" * 32))
    with pytest.raises(UnverifiedNote):
        open_note(GO_MESSAGE, [other.verifier])  # same name, another key hash: unknown


def test_a_known_key_whose_signature_fails_rejects_the_note() -> None:
    tampered = GO_MESSAGE.replace("then you don't", "then you do")
    with pytest.raises(InvalidNoteSignature):
        open_note(tampered, [parse_vkey(GO_VKEY)])


@pytest.mark.parametrize(
    "message",
    [
        GO_MESSAGE.replace("\n\n", "\n"),  # no blank line before the signatures
        GO_MESSAGE[:-1],  # signature block without its newline
        GO_MESSAGE.replace("\u2014 ", "- "),  # not an em dash
        GO_MESSAGE.replace("problem,", "problem,\t"),  # a control character
        GO_MESSAGE.replace("x08go", "x08g!"),  # not base64
        GO_MESSAGE.replace("PeterNeumann x08", "Peter+Neumann x08"),  # '+' in a key name
    ],
)
def test_malformed_notes_are_refused(message: str) -> None:
    with pytest.raises(MalformedNote):
        open_note(message, [parse_vkey(GO_VKEY)])


def test_invalid_utf8_is_refused() -> None:
    with pytest.raises(MalformedNote):
        open_note(GO_MESSAGE.encode("utf-8").replace(b"think", b"th\xffnk"), [parse_vkey(GO_VKEY)])


@pytest.mark.parametrize(
    "vkey",
    [
        GO_VKEY.replace("c74f20a3", "c74f20a4"),  # hash does not match
        GO_VKEY.replace("+ARpc", "+Ahpc"),  # another algorithm byte
        "PeterNeumann+c74f20a3",
        "Peter Neumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
    ],
)
def test_bad_verifier_keys_are_refused(vkey: str) -> None:
    with pytest.raises(NoteError):
        parse_vkey(vkey)


def test_text_that_open_would_read_otherwise_is_never_signed() -> None:
    signer = parse_skey(GO_SKEY)
    for text in ("no newline", "ends with a blank line\n\n", "tab\there\n"):
        with pytest.raises(MalformedNote):
            sign_note(text, [signer])


ORIGIN = "example.com/drawbridge/test"


def _signer() -> NoteSigner:
    return NoteSigner(ORIGIN, Ed25519PrivateKey.from_private_bytes(bytes(range(32))))


def test_a_checkpoint_is_the_three_c2sp_lines_signed_by_the_origin() -> None:
    tree = MerkleTree([leaf_hash(b"line %d" % i) for i in range(5)])
    checkpoint = Checkpoint(ORIGIN, 5, tree.root())
    note = sign_checkpoint(checkpoint, _signer())
    text, _, signature = note.partition("\n\n")
    assert text + "\n" == f"{ORIGIN}\n5\n{base64.b64encode(tree.root()).decode()}\n"
    assert signature.startswith(f"\u2014 {ORIGIN} ") and signature.endswith("\n") and signature.count("\n") == 1
    raw = base64.b64decode(signature.split(" ")[2])
    assert raw[:4] == _signer().verifier.key_hash.to_bytes(4, "big") and len(raw) == 68
    assert open_checkpoint(note, _signer().verifier) == checkpoint
    with pytest.raises(CheckpointError):
        sign_checkpoint(Checkpoint("another.example/log", 5, tree.root()), _signer())


@pytest.mark.parametrize(
    "text",
    ["o\n05\nAAAA\n", "o\n5\n\n", "o\n5\n" + base64.b64encode(b"x" * 31).decode() + "\n", "o\n-1\nAAAA\n", "o\n5\n"],
)
def test_malformed_checkpoint_bodies_are_refused(text: str) -> None:
    with pytest.raises(CheckpointError):
        parse_checkpoint_text(text)


def test_extension_lines_are_read_and_ignored() -> None:
    root = base64.b64encode(b"r" * 32).decode()
    assert parse_checkpoint_text(f"o\n7\n{root}\nextension\n") == Checkpoint("o", 7, b"r" * 32)


def test_a_tlog_proof_discloses_one_line() -> None:
    lines = [b'{"seq":%d}\n' % i for i in range(11)]
    tree = MerkleTree([trace_leaf(line) for line in lines])
    note = sign_checkpoint(Checkpoint(ORIGIN, 11, tree.root()), _signer())
    proof = make_tlog_proof(tree, 6, note, 11)
    text = proof.text
    assert text.startswith("c2sp.org/tlog-proof@v1\nindex 6\n") and text.endswith(note)
    parsed = parse_tlog_proof(text)
    assert parsed == proof
    assert verify_tlog_proof(parsed, lines[6], _signer().verifier).size == 11
    with pytest.raises(CheckpointError):
        verify_tlog_proof(parsed, lines[5], _signer().verifier)
    other = NoteSigner(ORIGIN, Ed25519PrivateKey.from_private_bytes(b"\x01" * 32))
    with pytest.raises(CheckpointError):
        verify_tlog_proof(parsed, lines[6], other.verifier)
