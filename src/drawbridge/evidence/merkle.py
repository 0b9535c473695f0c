"""RFC 6962 Merkle trees over the trace lines: roots, inclusion and consistency proofs, and their checks.

Invariant: every hash here is RFC 6962 section 2.1 (the same in RFC 9162 section 2.1): a leaf is
``SHA-256(0x00 || entry)``, an inner node ``SHA-256(0x01 || left || right)``, the tree over ``n > 1``
entries splits at the largest power of two below ``n``, and the empty tree's root is ``SHA-256("")``.
Proofs are made by the recursive definitions of RFC 6962 (``PATH``, ``PROOF``) and checked by the
iterative algorithms of RFC 9162 (sections 2.1.3.2 and 2.1.4.2), which share no code with the makers:
a proof that one side gets wrong the other refuses.

Theory of operation. A writer keeps a ``CompactRange`` (the roots of the perfect subtrees the tree
decomposes into, O(log n) hashes) and appends leaf hashes to it: O(1) hashes per append, amortized;
its ``root`` is the tree's root. A verifier, which has every line, builds a ``MerkleTree`` (every
level of perfect subtrees, 2n hashes) and asks it for the root at any size and for proofs between
sizes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

HASH_SIZE: Final = 32
EMPTY_ROOT: Final = hashlib.sha256(b"").digest()
"""The root of the tree over no entries."""


class MerkleError(ValueError):
    """A tree size, index or proof that cannot be used as given."""


def leaf_hash(entry: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two strictly below ``n`` (``n > 1``)."""
    return 1 << ((n - 1).bit_length() - 1)


class CompactRange:
    """The perfect subtrees a tree of ``size`` leaves decomposes into, largest first: what an
    appending writer keeps to know its root."""

    __slots__ = ("_sizes", "_hashes", "size")

    def __init__(self) -> None:
        self._sizes: list[int] = []
        self._hashes: list[bytes] = []
        self.size = 0

    def append(self, leaf: bytes) -> None:
        """Add the next leaf hash (``leaf_hash(entry)``)."""
        sizes, hashes = self._sizes, self._hashes
        sizes.append(1)
        hashes.append(leaf)
        while len(sizes) > 1 and sizes[-1] == sizes[-2]:
            right = hashes.pop()
            sizes.pop()
            hashes[-1] = node_hash(hashes[-1], right)
            sizes[-1] *= 2
        self.size += 1

    def root(self) -> bytes:
        hashes = self._hashes
        if not hashes:
            return EMPTY_ROOT
        root = hashes[-1]
        for left in reversed(hashes[:-1]):
            root = node_hash(left, root)
        return root


class MerkleTree:
    """Every level of perfect subtrees over a list of leaf hashes: roots and proofs at any size."""

    def __init__(self, leaves: Sequence[bytes]) -> None:
        levels = [list(leaves)]
        while len(levels[-1]) > 1:
            below = levels[-1]
            levels.append([node_hash(below[i], below[i + 1]) for i in range(0, len(below) - 1, 2)])
        self._levels = levels
        self.size = len(leaves)

    def _range(self, start: int, end: int) -> bytes:
        """MTH(D[start:end]) for a range the recursion of RFC 6962 produces (``start`` is a multiple of
        the largest power of two below ``end - start``): its perfect aligned subtrees, folded from the right."""
        parts: list[bytes] = []
        position = start
        while position < end:
            level = (end - position).bit_length() - 1
            while position % (1 << level):
                level -= 1
            parts.append(self._levels[level][position >> level])
            position += 1 << level
        root = parts[-1]
        for left in reversed(parts[:-1]):
            root = node_hash(left, root)
        return root

    def _check_size(self, size: int) -> None:
        if not 0 <= size <= self.size:
            raise MerkleError(f"tree size {size} is outside 0..{self.size}")

    def root(self, size: int | None = None) -> bytes:
        """The root of the tree over the first ``size`` leaves (default: all)."""
        size = self.size if size is None else size
        self._check_size(size)
        return EMPTY_ROOT if size == 0 else self._range(0, size)

    def inclusion_proof(self, index: int, size: int) -> list[bytes]:
        """RFC 6962 ``PATH(index, D[size])``: the audit path of leaf ``index`` in the tree of ``size``."""
        self._check_size(size)
        if not 0 <= index < size:
            raise MerkleError(f"leaf index {index} is outside a tree of size {size}")
        proof: list[bytes] = []
        start, end = 0, size
        while end - start > 1:
            k = _split(end - start)
            if index - start < k:
                proof.append(self._range(start + k, end))
                end = start + k
            else:
                proof.append(self._range(start, start + k))
                start += k
        proof.reverse()
        return proof

    def consistency_proof(self, old: int, new: int) -> list[bytes]:
        """RFC 6962 ``PROOF(old, D[new])``: that the tree of ``old`` leaves is a prefix of the one of ``new``."""
        self._check_size(new)
        if not 0 < old <= new:
            raise MerkleError(f"no consistency proof from size {old} to size {new} (needs 0 < old <= new)")
        proof: list[bytes] = []
        start, end, m, whole = 0, new, old, True
        while m != end - start:
            k = _split(end - start)
            if m <= k:
                proof.append(self._range(start + k, end))
                end = start + k
            else:
                proof.append(self._range(start, start + k))
                start += k
                m -= k
                whole = False
        if not whole:
            proof.append(self._range(start, end))
        proof.reverse()
        return proof


def _check_hashes(*hashes: bytes) -> None:
    for value in hashes:
        if len(value) != HASH_SIZE:
            raise MerkleError(f"a hash of {len(value)} bytes where SHA-256 has {HASH_SIZE}")


def root_from_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes]) -> bytes:
    """RFC 9162 2.1.3.2: the root an inclusion proof leads to from ``leaf``; raises on a malformed proof."""
    if not 0 <= index < size:
        raise MerkleError(f"leaf index {index} is outside a tree of size {size}")
    _check_hashes(leaf, *proof)
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            raise MerkleError("the inclusion proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise MerkleError("the inclusion proof is shorter than the tree is deep")
    return r


def verify_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes) -> bool:
    """Whether ``proof`` shows leaf hash ``leaf`` at ``index`` in the tree of ``size`` with ``root``."""
    try:
        return root_from_inclusion(index, size, leaf, proof) == root
    except MerkleError:
        return False


def verify_consistency(old: int, new: int, proof: Sequence[bytes], old_root: bytes, new_root: bytes) -> bool:
    """RFC 9162 2.1.4.2: whether ``proof`` shows the tree (``old``, ``old_root``) to be a prefix of
    (``new``, ``new_root``). Equal sizes need an empty proof and equal roots. A proof from the empty
    tree means nothing and is refused (as transparency-dev's verifier does): the empty tree is a prefix
    of every tree without one."""
    if not 0 < old <= new:
        return False
    if old == new:
        return not proof and old_root == new_root
    try:
        _check_hashes(old_root, new_root, *proof)
    except MerkleError:
        return False
    if not proof:
        return False
    path = list(proof)
    if old & (old - 1) == 0:  # an exact power of two: the old root is the first node
        path.insert(0, old_root)
    fn, sn = old - 1, new - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return fr == old_root and sr == new_root and sn == 0


__all__ = [
    "EMPTY_ROOT",
    "HASH_SIZE",
    "CompactRange",
    "MerkleError",
    "MerkleTree",
    "leaf_hash",
    "node_hash",
    "root_from_inclusion",
    "verify_consistency",
    "verify_inclusion",
]
