"""The trace as a transparency log: C2SP ``tlog-checkpoint`` bodies and ``tlog-proof`` files over its lines.

Invariant: the log's leaves are the trace lines, leaf ``i`` being the exact bytes of line ``i`` of
``trace.ndjson`` (0-based, its seq) without the terminating LF; a checkpoint is the note text
``<origin>\\n<tree size>\\n<base64 RFC 6962 root>\\n`` (no extension lines written, extension lines
read and ignored), signed as a C2SP signed note by the key named after the origin. What a checkpoint
proves and what it cannot is in docs/trace-chain.md ("Signed checkpoints").

A ``tlog-proof`` (C2SP, untagged) is ``c2sp.org/tlog-proof@v1``, ``index <n>``, the inclusion hashes
one per line (RFC 6962 ``PATH``, leaf's sibling first), a blank line and the signed checkpoint
verbatim: one record disclosed and proven to be in the signed log without the others.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from drawbridge.evidence.merkle import HASH_SIZE, MerkleTree, leaf_hash, verify_inclusion
from drawbridge.evidence.signed_note import (
    NoteError,
    NoteSigner,
    NoteVerifier,
    is_valid_key_name,
    open_note,
    sign_note,
)

PROOF_HEADER: Final = "c2sp.org/tlog-proof@v1"
DEFAULT_ORIGIN_DOMAIN: Final = "drawbridge.local"
_DECIMAL = re.compile(r"0|[1-9][0-9]*")


class CheckpointError(ValueError):
    """A checkpoint or proof that cannot be read or does not verify; the message says which."""


@dataclass(frozen=True)
class Checkpoint:
    """A tree head: who issued it (``origin``), over how many leaves, with which root."""

    origin: str
    size: int
    root: bytes

    @property
    def text(self) -> str:
        """The note text (what is signed)."""
        return f"{self.origin}\n{self.size}\n{base64.b64encode(self.root).decode('ascii')}\n"


def trace_leaf(line: bytes) -> bytes:
    """The leaf hash of one trace line (with or without its LF): ``leaf_hash`` of its bytes, without
    copying them (it runs for every line the gateway writes)."""
    digest = hashlib.sha256(b"\x00")
    digest.update(memoryview(line)[:-1] if line.endswith(b"\n") else line)
    return digest.digest()


def parse_checkpoint_text(text: str) -> Checkpoint:
    """A checkpoint body: origin, decimal size without leading zeros, a 32-byte base64 root (extension
    lines, non-empty, are allowed and ignored)."""
    if not text.endswith("\n"):
        raise CheckpointError("a checkpoint's text ends with a newline")
    lines = text[:-1].split("\n")
    if len(lines) < 3 or any(not line for line in lines):
        raise CheckpointError("a checkpoint has an origin, a tree size and a root hash, each on a non-empty line")
    origin, size_text, root_text = lines[:3]
    if not _DECIMAL.fullmatch(size_text) or len(size_text) > 20:
        raise CheckpointError("a checkpoint's tree size is a decimal number without leading zeros")
    try:
        root = base64.b64decode(root_text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise CheckpointError("a checkpoint's root hash is not standard base64") from None
    if len(root) != HASH_SIZE:
        raise CheckpointError("a checkpoint's root hash is not 32 bytes")
    return Checkpoint(origin, int(size_text), root)


def sign_checkpoint(checkpoint: Checkpoint, signer: NoteSigner) -> str:
    """The signed note of a checkpoint; the key's name must be the origin."""
    if signer.name != checkpoint.origin:
        raise CheckpointError("a checkpoint is signed by the key named after its origin")
    return sign_note(checkpoint.text, [signer])


def open_checkpoint(note: bytes | str, verifier: NoteVerifier) -> Checkpoint:
    """The checkpoint a signed note holds, once ``verifier``'s signature verifies and the origin is
    the key's name; raises ``CheckpointError`` saying what is wrong."""
    try:
        opened = open_note(note, [verifier])
    except NoteError as exc:
        raise CheckpointError(f"the checkpoint's signature: {exc}") from None
    checkpoint = parse_checkpoint_text(opened.text)
    if checkpoint.origin != verifier.name:
        raise CheckpointError(
            f"the checkpoint's origin {checkpoint.origin!r} is not the name of its key {verifier.name!r}"
        )
    return checkpoint


def is_valid_origin(origin: str) -> bool:
    """An origin drawbridge signs as: a key name (no spaces, no ``+``), printable ASCII, no newline."""
    return is_valid_key_name(origin) and origin.isascii() and origin.isprintable() and len(origin) <= 255


def checkpoint_of(leaves: Sequence[bytes] | MerkleTree, origin: str, size: int | None = None) -> Checkpoint:
    tree = leaves if isinstance(leaves, MerkleTree) else MerkleTree(leaves)
    size = tree.size if size is None else size
    return Checkpoint(origin, size, tree.root(size))


# --------------------------------------------------------------------------- tlog-proof


@dataclass(frozen=True)
class TlogProof:
    index: int
    hashes: tuple[bytes, ...]
    note: str
    extra: bytes | None = None

    @property
    def text(self) -> str:
        lines = [PROOF_HEADER]
        if self.extra is not None:
            lines.append("extra " + base64.b64encode(self.extra).decode("ascii"))
        lines.append(f"index {self.index}")
        lines.extend(base64.b64encode(value).decode("ascii") for value in self.hashes)
        return "\n".join(lines) + "\n\n" + self.note


def make_tlog_proof(tree: MerkleTree, index: int, note: str, size: int) -> TlogProof:
    """The proof of leaf ``index`` in the signed tree of ``size`` leaves (``note`` signs that tree)."""
    return TlogProof(index, tuple(tree.inclusion_proof(index, size)), note)


def parse_tlog_proof(text: str) -> TlogProof:
    head, separator, note = text.partition("\n\n")
    if not separator:
        raise CheckpointError("a tlog-proof has a blank line before its checkpoint")
    lines = head.split("\n")
    if lines[0] != PROOF_HEADER:
        raise CheckpointError(f"a tlog-proof starts with {PROOF_HEADER}")
    position = 1
    extra = None
    if len(lines) > position and lines[position].startswith("extra "):
        try:
            extra = base64.b64decode(lines[position][6:].encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError, ValueError):
            raise CheckpointError("a tlog-proof's extra data is not base64") from None
        position += 1
    if len(lines) <= position or not lines[position].startswith("index "):
        raise CheckpointError("a tlog-proof names its leaf: index <n>")
    index_text = lines[position][6:]
    if not _DECIMAL.fullmatch(index_text) or len(index_text) > 20:
        raise CheckpointError("a tlog-proof's index is a decimal number without leading zeros")
    hashes = []
    for line in lines[position + 1 :]:
        try:
            value = base64.b64decode(line.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError, ValueError):
            raise CheckpointError("a tlog-proof's hash is not base64") from None
        if len(value) != HASH_SIZE:
            raise CheckpointError("a tlog-proof's hash is not 32 bytes")
        hashes.append(value)
    return TlogProof(int(index_text), tuple(hashes), note, extra)


def verify_tlog_proof(proof: TlogProof, line: bytes, verifier: NoteVerifier) -> Checkpoint:
    """The signed checkpoint that ``line`` (a trace line) is proven to be leaf ``proof.index`` of;
    raises ``CheckpointError`` when the signature or the inclusion does not verify."""
    checkpoint = open_checkpoint(proof.note, verifier)
    if not verify_inclusion(proof.index, checkpoint.size, trace_leaf(line), proof.hashes, checkpoint.root):
        raise CheckpointError(
            f"the line is not leaf {proof.index} of the signed tree of size {checkpoint.size}: the inclusion "
            "proof does not lead to the checkpoint's root"
        )
    return checkpoint


def tree_of_lines(lines: Iterable[bytes]) -> MerkleTree:
    return MerkleTree([trace_leaf(line) for line in lines])


__all__ = [
    "DEFAULT_ORIGIN_DOMAIN",
    "PROOF_HEADER",
    "Checkpoint",
    "CheckpointError",
    "TlogProof",
    "checkpoint_of",
    "is_valid_origin",
    "make_tlog_proof",
    "open_checkpoint",
    "parse_checkpoint_text",
    "parse_tlog_proof",
    "sign_checkpoint",
    "trace_leaf",
    "tree_of_lines",
    "verify_tlog_proof",
]
