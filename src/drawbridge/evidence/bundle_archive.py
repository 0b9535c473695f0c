"""The container of an Assay evidence bundle: a GNU tar of exactly two members, gzip-wrapped.

Invariant: the tar stream written here is byte for byte what Assay's ``BundleWriter`` writes for the
same two members (the ``tar`` crate's GNU headers: mode ``0000644``, uid and gid ``0000000``, mtime
``00000000000``, checksum ``%07o`` + NUL, typeflag NUL, magic ``ustar `` and version `` \\0``, user
and group ``assay``, everything else zero; data padded to 512 bytes; two zero blocks at the end and
no padding to a 10240-byte record). The gzip header is Assay's too (``1f 8b 08 00 00000000 02 ff``:
no name, mtime 0, XFL 2, OS 255); the deflate body is zlib's at level 9, which is not Assay's
``miniz_oxide`` body: the archive's own digest is the digest of what was written, and what is pinned
and compared is the member bytes and the tar stream.

The reader is strict, as Assay's verifier is (auditor-evidence.md 1.6): only regular members named
``manifest.json`` (first) and ``events.ndjson``, no duplicate, no path component other than a name,
sizes within bounds, a gzip stream that ends with a good CRC and length and nothing after it.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Final

BLOCK: Final = 512
MEMBER_NAMES: Final = ("manifest.json", "events.ndjson")
MAX_BUNDLE_BYTES: Final = 100 * 1024 * 1024
MAX_DECODED_BYTES: Final = 1024 * 1024 * 1024
MAX_MEMBER_BYTES: Final = {"manifest.json": 10 * 1024 * 1024, "events.ndjson": 500 * 1024 * 1024}
GZIP_HEADER: Final = bytes.fromhex("1f8b08000000000002ff")


class ArchiveError(ValueError):
    """A container that is not a bundle; the message says which rule it breaks."""


def _field(value: bytes, size: int) -> bytes:
    if len(value) > size:
        raise ArchiveError(f"a tar header field of {size} bytes cannot hold {len(value)}")
    return value + b"\0" * (size - len(value))


def gnu_header(name: str, size: int) -> bytes:
    """The 512-byte GNU header the ``tar`` crate writes for a bundle member."""
    header = b"".join((
        _field(name.encode("utf-8"), 100),
        b"0000644\0",
        b"0000000\0",
        b"0000000\0",
        _field(b"%011o" % size, 12),
        b"00000000000\0",
        b" " * 8,  # the checksum, counted as spaces
        b"\0",  # typeflag NUL (a regular file)
        b"\0" * 100,  # linkname
        b"ustar ",
        b" \0",
        _field(b"assay", 32),
        _field(b"assay", 32),
    ))
    header = header + b"\0" * (BLOCK - len(header))
    checksum = b"%07o\0" % sum(header)
    return header[:148] + checksum + header[156:]


def tar_stream(members: Sequence[tuple[str, bytes]]) -> bytes:
    parts = []
    for name, data in members:
        parts.append(gnu_header(name, len(data)))
        parts.append(data + b"\0" * (-len(data) % BLOCK))
    parts.append(b"\0" * (2 * BLOCK))
    return b"".join(parts)


def gzip_wrap(data: bytes) -> bytes:
    """Assay's gzip header, a zlib level-9 raw deflate body, CRC32 and length (little-endian)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    body = compressor.compress(data) + compressor.flush()
    trailer = zlib.crc32(data).to_bytes(4, "little") + (len(data) & 0xFFFFFFFF).to_bytes(4, "little")
    return GZIP_HEADER + body + trailer


def gunzip(data: bytes) -> bytes:
    """One gzip member, whole: header, body, CRC and length checked, nothing after it."""
    if len(data) > MAX_BUNDLE_BYTES:
        raise ArchiveError(f"the bundle is larger than {MAX_BUNDLE_BYTES} bytes")
    decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = decoder.decompress(data, MAX_DECODED_BYTES + 1)
    except zlib.error as exc:
        raise ArchiveError(f"the bundle is not a valid gzip stream ({exc})") from None
    if len(out) > MAX_DECODED_BYTES:
        raise ArchiveError(f"the bundle decodes to more than {MAX_DECODED_BYTES} bytes")
    if not decoder.eof:
        raise ArchiveError("the gzip stream is cut short (no end, CRC or length)")
    if decoder.unused_data:
        raise ArchiveError("bytes follow the gzip stream")
    return out


def _octal(field: bytes, what: str) -> int:
    text = field.rstrip(b"\0 ").lstrip(b" ")
    if not text or any(c not in b"01234567" for c in text):
        raise ArchiveError(f"a tar header's {what} is not an octal number")
    return int(text, 8)


def read_members(stream: bytes) -> dict[str, bytes]:
    """The members of a bundle's tar stream, in order: ``manifest.json`` first, then ``events.ndjson``."""
    members: dict[str, bytes] = {}
    position = 0
    while True:
        header = stream[position : position + BLOCK]
        if len(header) < BLOCK:
            raise ArchiveError("the tar stream ends inside a header (no end-of-archive blocks)")
        if header == b"\0" * BLOCK:
            break
        stored = _octal(header[148:156], "checksum")
        if stored != sum(header[:148]) + 8 * 32 + sum(header[156:]):
            raise ArchiveError("a tar header's checksum does not match it")
        name_bytes = header[:100].split(b"\0", 1)[0]
        if header[345:500].strip(b"\0") and header[257:263] == b"ustar\0":
            raise ArchiveError("a tar member name uses a ustar prefix")
        try:
            name = name_bytes.decode("utf-8")
        except UnicodeDecodeError:
            raise ArchiveError("a tar member name is not UTF-8") from None
        typeflag = header[156:157]
        if typeflag not in (b"\0", b"0"):
            raise ArchiveError(f"tar member {name!r} is not a regular file (type {typeflag!r})")
        if name.startswith("/") or any(part in ("", ".", "..") for part in name.split("/")) or "/" in name:
            raise ArchiveError(f"tar member {name!r} is not a plain name")
        if name not in MEMBER_NAMES:
            raise ArchiveError(f"tar member {name!r} is not manifest.json or events.ndjson")
        if name in members:
            raise ArchiveError(f"tar member {name} appears twice")
        if not members and name != "manifest.json":
            raise ArchiveError("the first tar member is not manifest.json")
        size = _octal(header[124:136], "size")
        if size > MAX_MEMBER_BYTES[name]:
            raise ArchiveError(f"tar member {name} is larger than {MAX_MEMBER_BYTES[name]} bytes")
        start = position + BLOCK
        data = stream[start : start + size]
        if len(data) != size:
            raise ArchiveError(f"tar member {name} is cut short")
        members[name] = data
        position = start + size + (-size % BLOCK)
    if set(members) != set(MEMBER_NAMES):
        raise ArchiveError("the bundle lacks " + " and ".join(n for n in MEMBER_NAMES if n not in members))
    return members


__all__ = [
    "GZIP_HEADER",
    "MEMBER_NAMES",
    "ArchiveError",
    "gnu_header",
    "gunzip",
    "gzip_wrap",
    "read_members",
    "tar_stream",
]
