"""RFC 6962 trees: roots, inclusion and consistency proofs against the RFC's own definitions, computed here
with hashlib alone, and against transparency-dev/merkle's committed vectors."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drawbridge.evidence.merkle import (
    EMPTY_ROOT,
    CompactRange,
    MerkleTree,
    leaf_hash,
    root_from_inclusion,
    verify_consistency,
    verify_inclusion,
)

VECTORS = Path(__file__).resolve().parent / "vectors" / "merkle" / "transparency-dev.json"

# The entries of the RFC 6962 test data (certificate-transparency's "leaves"), hex.
CT_LEAVES = [bytes.fromhex(h) for h in (
    "", "00", "10", "2021", "3031", "40414243", "5051525354555657", "606162636465666768696a6b6c6d6e6f",
)]


# --------------------------------------------------------------------------- the RFC, literally


def sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def k_of(n: int) -> int:
    """The largest power of two smaller than n (RFC 6962 2.1)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def mth(entries: list[bytes]) -> bytes:
    """MTH(D[n]) of RFC 6962 2.1."""
    n = len(entries)
    if n == 0:
        return sha(b"")
    if n == 1:
        return sha(b"\x00" + entries[0])
    k = k_of(n)
    return sha(b"\x01" + mth(entries[:k]) + mth(entries[k:]))


def path(m: int, entries: list[bytes]) -> list[bytes]:
    """PATH(m, D[n]) of RFC 6962 2.1.1."""
    n = len(entries)
    if n == 1:
        return []
    k = k_of(n)
    if m < k:
        return path(m, entries[:k]) + [mth(entries[k:])]
    return path(m - k, entries[k:]) + [mth(entries[:k])]


def subproof(m: int, entries: list[bytes], whole: bool) -> list[bytes]:
    """SUBPROOF(m, D[n], b) of RFC 6962 2.1.2."""
    n = len(entries)
    if m == n:
        return [] if whole else [mth(entries)]
    k = k_of(n)
    if m <= k:
        return subproof(m, entries[:k], whole) + [mth(entries[k:])]
    return subproof(m - k, entries[k:], False) + [mth(entries[:k])]


def entries_of(n: int) -> list[bytes]:
    """The CT leaves, then more of the same pattern (entry i: bytes 16*i .. 16*i + i)."""
    out = list(CT_LEAVES[:n])
    for i in range(len(out), n):
        out.append(bytes((16 * i + j) % 256 for j in range(i % 17)))
    return out


SIZES = list(range(0, 9)) + [13, 16, 17, 31, 32, 33, 64, 100, 257]


@pytest.mark.parametrize("n", SIZES)
def test_roots_are_the_rfc_definition_whichever_way_they_are_built(n: int) -> None:
    entries = entries_of(n)
    expected = mth(entries)
    compact = CompactRange()
    for entry in entries:
        compact.append(leaf_hash(entry))
    tree = MerkleTree([leaf_hash(e) for e in entries])
    assert compact.size == n
    assert compact.root() == expected == tree.root()
    for size in range(n + 1):  # every prefix, from the full tree's levels
        assert tree.root(size) == mth(entries[:size])


def test_the_published_ct_roots() -> None:
    """The RFC 6962 roots of the CT test leaves for sizes 0, 1 and 8 (their published prefixes)."""
    tree = MerkleTree([leaf_hash(e) for e in CT_LEAVES])
    assert tree.root(0) == EMPTY_ROOT and EMPTY_ROOT.hex().startswith("e3b0c442")
    assert tree.root(1).hex().startswith("6e340b9c")
    assert tree.root(8).hex().startswith("5dc9da79")


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 13, 33, 100])
def test_inclusion_proofs_are_path_and_verify(n: int) -> None:
    entries = entries_of(n)
    tree = MerkleTree([leaf_hash(e) for e in entries])
    for size in range(1, n + 1):
        root = mth(entries[:size])
        for index in range(size):
            proof = tree.inclusion_proof(index, size)
            assert proof == path(index, entries[:size])
            leaf = leaf_hash(entries[index])
            assert verify_inclusion(index, size, leaf, proof, root)
            assert root_from_inclusion(index, size, leaf, proof) == root
            # Another leaf, another index, a changed hash, one hash too many or too few: refused.
            other = leaf_hash(entries[index] + b"x")
            assert not verify_inclusion(index, size, other, proof, root)
            if size > 1:
                assert not verify_inclusion((index + 1) % size, size, leaf, proof, root)
                flipped = [bytes([proof[0][0] ^ 1]) + proof[0][1:], *proof[1:]]
                assert not verify_inclusion(index, size, leaf, flipped, root)
                assert not verify_inclusion(index, size, leaf, proof[:-1], root)
            assert not verify_inclusion(index, size, leaf, [*proof, root], root)
            assert not verify_inclusion(size, size, leaf, proof, root)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 13, 33, 100])
def test_consistency_proofs_are_proof_and_verify(n: int) -> None:
    entries = entries_of(n)
    tree = MerkleTree([leaf_hash(e) for e in entries])
    for new in range(1, n + 1):
        new_root = mth(entries[:new])
        for old in range(1, new + 1):
            old_root = mth(entries[:old])
            proof = tree.consistency_proof(old, new)
            assert proof == subproof(old, entries[:new], True)
            assert verify_consistency(old, new, proof, old_root, new_root)
            if old < new:
                # A rewritten old tree, a changed proof, or a shortened one does not verify.
                forged = mth([b"forged"] + entries[1:old])
                assert not verify_consistency(old, new, proof, forged, new_root)
                assert not verify_consistency(old, new, proof, old_root, forged)
                flipped = [*proof[:-1], bytes([proof[-1][0] ^ 1]) + proof[-1][1:]]
                assert not verify_consistency(old, new, flipped, old_root, new_root)
                assert not verify_consistency(old, new, proof[:-1], old_root, new_root)
                assert not verify_consistency(new, old, proof, new_root, old_root)
    assert not verify_consistency(0, n, [], EMPTY_ROOT, mth(entries))  # meaningless, refused


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=70), st.data())
def test_any_tree_any_proof(entries: list[bytes], data: st.DataObject) -> None:
    tree = MerkleTree([leaf_hash(e) for e in entries])
    new = data.draw(st.integers(1, len(entries)))
    old = data.draw(st.integers(1, new))
    index = data.draw(st.integers(0, new - 1))
    assert tree.root(new) == mth(entries[:new])
    assert verify_inclusion(index, new, leaf_hash(entries[index]), tree.inclusion_proof(index, new), mth(entries[:new]))
    assert verify_consistency(old, new, tree.consistency_proof(old, new), mth(entries[:old]), mth(entries[:new]))


def _b64(value: str | None) -> bytes:
    return base64.b64decode(value) if value else b""


def _hashes(values: list[str] | None) -> list[bytes]:
    return [_b64(v) for v in values or []]


VECTOR_DATA = json.loads(VECTORS.read_text(encoding="utf-8"))


@pytest.mark.parametrize("vector", VECTOR_DATA["inclusion"], ids=lambda v: v["file"])
def test_transparency_dev_inclusion_vectors(vector: dict) -> None:
    got = verify_inclusion(
        vector["leafIdx"], vector["treeSize"], _b64(vector["leafHash"]), _hashes(vector["proof"]), _b64(vector["root"])
    )
    assert got is (not vector["wantErr"])


@pytest.mark.parametrize("vector", VECTOR_DATA["consistency"], ids=lambda v: v["file"])
def test_transparency_dev_consistency_vectors(vector: dict) -> None:
    got = verify_consistency(
        vector["size1"], vector["size2"], _hashes(vector["proof"]), _b64(vector["root1"]), _b64(vector["root2"])
    )
    assert got is (not vector["wantErr"])


def test_the_vectors_are_all_there() -> None:
    assert len(VECTOR_DATA["inclusion"]) == 98 and len(VECTOR_DATA["consistency"]) == 98
