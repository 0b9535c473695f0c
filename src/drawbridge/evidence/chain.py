"""The hash-chained trace: how an entry is built, written as a line, and verified.

Invariant: an entry's bytes on disk are a pure function of (previous head, kind,
at, body). Nothing else goes into an entry, and a verifier that recomputes every
entry from its line and its predecessor's hash accepts exactly the logs this
module can write, in the order it wrote them.

Entry format (``drawbridge.trace_entry.v0``). One JSON object per line, the
line ending in a single ``\\n``; the fields appear in this order::

    {"schema":"drawbridge.trace_entry.v0",
     "seq":0,                      0-based, +1 per entry, no gaps
     "prev_hash":"sha256:000…0",   GENESIS_HASH for seq 0, else the previous entry_hash
     "kind":"tool_decision",       [a-z0-9_.]+  (tool_decision, policy_edit, pin_accept, ...)
     "at":"2026-01-01T00:00:00Z",  RFC 3339 UTC, given by the caller (the core has no clock)
     "body":{...},                 any JSON object
     "entry_hash":"sha256:…"}      jcs_digest of the entry without its entry_hash key

(shown wrapped; on disk it is one line). Each value is written in its RFC 8785
(JCS) form and the object has no whitespace, so a line is
``{"schema":J(schema),"seq":J(seq),...,"entry_hash":J(entry_hash)}\\n`` where
``J`` is JCS. The field order on the line is fixed and is *not* JCS key order;
the hash, by contrast, is taken over JCS bytes, which sort keys, so the hash does
not depend on the line's field order. Because the line form is fully determined,
the verifier also demands that each line equals the form re-rendered from its
parsed value: a byte changed anywhere in a file makes verification fail, even
where JSON parsing alone would not notice (``\\u001F`` for ``\\u001f``, ``1E+21``
for ``1e+21``, an added space).

Theory of operation. ``make_entry`` takes the head of the chain so far
(``ChainHead``: seq and entry_hash of the last entry, or None for an empty log)
and returns the next entry as a dict in field order; ``entry_line`` renders it.
The body is normalized through JCS once (``parse(J(body))``), so the entry
``make_entry`` returns equals the entry a reader parses back from the line
(JCS renders ``1.0`` as ``1`` and integers beyond 2**53 as doubles).
``verify_chain`` reads lines one at a time in O(1) memory and stops at the first
problem. For each line it checks, in order: the line is complete, is JSON, is an
object, has the schema, has exactly the fields with the right types, has
well-formed digests, its entry_hash matches its content (``hash_mismatch``: the
entry was changed), it is in canonical line form, its seq is the one expected
(``seq_gap``: an entry is missing; ``seq_reorder``: entries were moved;
``seq_duplicate``: the previous entry repeated), and its prev_hash links to the
previous entry (``broken_link``: the previous entry was replaced with a
self-consistent one). Content is checked before position, so an edited entry is
reported as edited, not as misplaced.

What the chain proves and what it does not. It proves that no entry in the
file was changed, removed, reordered or inserted *relative to the rest of the
file*. It cannot, by itself, show that entries were cut from the end, or that
the whole file was rewritten from some point on: the shortened or rewritten
file is again a valid chain. Checkpoints close that gap: a checkpoint
(``drawbridge.trace_checkpoint.v0``: seq, entry_hash, at) records a head seen
earlier, and ``verify_chain(..., expected_head=...)`` reports ``truncated`` when
the log ends before the checkpoint's seq and ``checkpoint_mismatch`` when the
entry at that seq has another hash. These heads are unsigned: one kept apart from
the log (another host, a ticket) reveals a cut tail. The gateway's own signed
checkpoints are C2SP notes over an RFC 6962 tree of the lines, beside the chain
(``drawbridge.evidence.tlog``, ``trace_audit``); they leave these fields as they are.

Size. Building, rendering and verifying an entry stay together because the verifier's guarantee is
that it accepts exactly the lines the builder writes: the line form, the hash and the checks are one
format, read side by side.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from drawbridge.canonical import (
    Canonical,
    CanonicalizationError,
    canonical_bytes,
    is_sha256_digest,
    jcs_digest,
    parse_json,
    sha256_prefixed,
)

ENTRY_SCHEMA = "drawbridge.trace_entry.v0"
_SCHEMA_PREIMAGE_PART = f',"schema":"{ENTRY_SCHEMA}","seq":'.encode()
_SCHEMA_LINE_PART = f'{{"schema":"{ENTRY_SCHEMA}","seq":'.encode()
CHECKPOINT_SCHEMA = "drawbridge.trace_checkpoint.v0"
GENESIS_HASH = "sha256:" + "0" * 64

#: The fields of an entry, in the order they appear on the line.
ENTRY_FIELDS: tuple[str, ...] = ("schema", "seq", "prev_hash", "kind", "at", "body", "entry_hash")
CHECKPOINT_FIELDS: tuple[str, ...] = ("schema", "seq", "entry_hash", "at")

_KIND_RE = re.compile(r"[a-z0-9_.]+")
# RFC 3339 in UTC, spelled with "Z": what every producer in drawbridge writes.
_AT_RE = re.compile(
    r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"  # date
    r"T([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d{1,9})?Z"  # time, UTC
)

#: Every code ``ChainProblem.code`` can take.
PROBLEM_CODES: frozenset[str] = frozenset(
    {
        "trailing_partial_line",
        "malformed_json",
        "not_an_object",
        "wrong_schema",
        "missing_field",
        "unknown_field",
        "bad_field",
        "bad_hash_form",
        "hash_mismatch",
        "noncanonical_line",
        "seq_gap",
        "seq_reorder",
        "seq_duplicate",
        "broken_link",
        "truncated",
        "checkpoint_mismatch",
    }
)


@dataclass(frozen=True)
class ChainHead:
    """The last entry of a chain: what the next entry links to."""

    seq: int
    entry_hash: str


@dataclass(frozen=True)
class ChainProblem:
    """The first thing wrong with a log. ``line`` is 1-based; ``seq`` is None when unknown."""

    line: int
    seq: int | None
    code: str
    message: str


@dataclass(frozen=True)
class ChainReport:
    """``entries`` counts the entries verified before the first problem (all of them when ok)."""

    ok: bool
    entries: int
    head: ChainHead | None
    first_problem: ChainProblem | None

    def to_dict(self) -> dict[str, Any]:
        """The machine report (plain JSON types)."""
        problem = self.first_problem
        return {
            "ok": self.ok,
            "entries": self.entries,
            "head": None if self.head is None else {"seq": self.head.seq, "entry_hash": self.head.entry_hash},
            "first_problem": None
            if problem is None
            else {"line": problem.line, "seq": problem.seq, "code": problem.code, "message": problem.message},
        }


class ChainFormatError(ValueError):
    """An entry or checkpoint cannot be built or read as given."""


# --------------------------------------------------------------------------- building


def is_valid_kind(kind: object) -> bool:
    return isinstance(kind, str) and kind.isascii() and _KIND_RE.fullmatch(kind) is not None


def is_valid_at(at: object) -> bool:
    return isinstance(at, str) and at.isascii() and _AT_RE.fullmatch(at) is not None


def _is_seq(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def entry_hash_of(entry: Mapping[str, Any]) -> str:
    """jcs_digest of the entry without its ``entry_hash`` key."""
    return jcs_digest({key: value for key, value in entry.items() if key != "entry_hash"})


def build_entry(
    prev: ChainHead | None, kind: str, at: str, body: Mapping[str, Any] | Canonical
) -> tuple[dict[str, Any], bytes]:
    """The entry that follows ``prev`` and its stored line, canonicalizing the body only once."""
    head, line, body_bytes = _entry_parts(prev, kind, at, body)
    entry: dict[str, Any] = {
        "schema": ENTRY_SCHEMA,
        "seq": head.seq,
        "prev_hash": prev.entry_hash if prev is not None else GENESIS_HASH,
        "kind": kind,
        "at": at,
        "body": parse_json(body_bytes),
        "entry_hash": head.entry_hash,
    }
    return entry, line


def next_line(
    prev: ChainHead | None, kind: str, at: str, body: Mapping[str, Any] | Canonical
) -> tuple[ChainHead, bytes]:
    """``build_entry`` for a writer that keeps only the new head and the line (no parsed entry)."""
    head, line, _body_bytes = _entry_parts(prev, kind, at, body)
    return head, line


def _entry_parts(
    prev: ChainHead | None, kind: str, at: str, body: Mapping[str, Any] | Canonical
) -> tuple[ChainHead, bytes, bytes]:
    """The new head, the stored line and the body's canonical bytes.

    Every field but ``body`` is a string from a fixed ASCII alphabet (checked here) or a
    small integer, so its JCS form is the string in quotes or the decimal digits; the
    entry's JCS preimage (keys sorted: at, body, kind, prev_hash, schema, seq) and its
    stored line (keys in ENTRY_FIELDS order) are assembled from the same pieces. A body
    given as ``Canonical`` bytes (a writer's own rendering of a JSON object) is used as is.
    """
    if not is_valid_kind(kind):
        raise ChainFormatError("kind must be a non-empty string of [a-z0-9_.]")
    if not is_valid_at(at):
        raise ChainFormatError("at must be an RFC 3339 UTC timestamp ending in Z (YYYY-MM-DDTHH:MM:SS[.f]Z)")
    if type(body) is Canonical:
        if not body.startswith(b"{"):
            raise ChainFormatError("body must be a JSON object")
        body_bytes = bytes(body)
    elif not isinstance(body, Mapping):
        raise ChainFormatError("body must be a JSON object")
    else:
        try:
            body_bytes = canonical_bytes(body if type(body) is dict else dict(body))
        except CanonicalizationError as exc:
            raise ChainFormatError(f"body has no canonical JSON form: {exc}") from exc
    if prev is None:
        seq, prev_hash = 0, GENESIS_HASH
    else:
        if not _is_seq(prev.seq) or not is_sha256_digest(prev.entry_hash):
            raise ChainFormatError("prev must hold a seq >= 0 and a sha256: entry_hash")
        seq, prev_hash = prev.seq + 1, prev.entry_hash
    if seq >= 2**53:
        raise ChainFormatError("seq beyond 2^53 has no exact JSON number")
    at_b, kind_b, prev_b = f'"{at}"'.encode(), f'"{kind}"'.encode(), f'"{prev_hash}"'.encode()
    seq_b = str(seq).encode()
    entry_hash = sha256_prefixed(b"".join((
        b'{"at":', at_b, b',"body":', body_bytes, b',"kind":', kind_b, b',"prev_hash":', prev_b,
        _SCHEMA_PREIMAGE_PART, seq_b, b"}",
    )))
    line = b"".join((
        _SCHEMA_LINE_PART, seq_b, b',"prev_hash":', prev_b, b',"kind":', kind_b, b',"at":', at_b,
        b',"body":', body_bytes, b',"entry_hash":"', entry_hash.encode(), b'"}\n',
    ))
    return ChainHead(seq=seq, entry_hash=entry_hash), line, body_bytes


def make_entry(prev: ChainHead | None, kind: str, at: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """The entry that follows ``prev`` (None: the first entry of a log), as a dict in field order."""
    return build_entry(prev, kind, at, body)[0]


def head_of(entry: Mapping[str, Any]) -> ChainHead:
    return ChainHead(seq=entry["seq"], entry_hash=entry["entry_hash"])


def _render(obj: Mapping[str, Any], fields: tuple[str, ...]) -> bytes:
    parts = [b'"' + name.encode("ascii") + b'":' + canonical_bytes(obj[name]) for name in fields]
    return b"{" + b",".join(parts) + b"}"


def entry_line(entry: Mapping[str, Any]) -> bytes:
    """The line an entry is stored as: fields in order, each value in JCS form, then ``\\n``."""
    if tuple(entry.keys()) != ENTRY_FIELDS:
        fields = ", ".join(ENTRY_FIELDS)
        raise ChainFormatError(f"an entry has exactly the fields {fields}, in that order")
    return _render(entry, ENTRY_FIELDS) + b"\n"


# --------------------------------------------------------------------------- checkpoints


def make_checkpoint(head: ChainHead, at: str) -> dict[str, Any]:
    """An (unsigned) checkpoint recording ``head`` as seen at ``at``."""
    if not _is_seq(head.seq) or not is_sha256_digest(head.entry_hash):
        raise ChainFormatError("head must hold a seq >= 0 and a sha256: entry_hash")
    if not is_valid_at(at):
        raise ChainFormatError("at must be an RFC 3339 UTC timestamp ending in Z")
    return {"schema": CHECKPOINT_SCHEMA, "seq": head.seq, "entry_hash": head.entry_hash, "at": at}


def checkpoint_bytes(checkpoint: Mapping[str, Any]) -> bytes:
    """A checkpoint as one JSON line (fields in order, JCS values), the form to store or sign."""
    return _render(checkpoint, CHECKPOINT_FIELDS) + b"\n"


def parse_checkpoint(value: object) -> ChainHead:
    """The head a checkpoint records. Refuses anything but the exact checkpoint shape."""
    if not isinstance(value, dict):
        raise ChainFormatError("a checkpoint is a JSON object")
    if value.get("schema") != CHECKPOINT_SCHEMA:
        raise ChainFormatError(f"checkpoint schema must be {CHECKPOINT_SCHEMA!r}")
    missing = [name for name in CHECKPOINT_FIELDS if name not in value]
    if missing:
        raise ChainFormatError("checkpoint lacks field(s): " + ", ".join(missing))
    unknown = sorted(name for name in value if name not in CHECKPOINT_FIELDS)
    if unknown:
        raise ChainFormatError("checkpoint has unknown field(s): " + ", ".join(unknown))
    if not _is_seq(value["seq"]):
        raise ChainFormatError("checkpoint seq must be an integer >= 0")
    if not is_sha256_digest(value["entry_hash"]):
        raise ChainFormatError("checkpoint entry_hash must be sha256: + 64 lowercase hex")
    if not is_valid_at(value["at"]):
        raise ChainFormatError("checkpoint at must be an RFC 3339 UTC timestamp ending in Z")
    return ChainHead(seq=value["seq"], entry_hash=value["entry_hash"])


# --------------------------------------------------------------------------- verifying


class _Stop(Exception):
    def __init__(self, problem: ChainProblem) -> None:
        self.problem = problem


def _as_bytes(line: str | bytes) -> bytes:
    return line.encode("utf-8", "surrogatepass") if isinstance(line, str) else bytes(line)


def _parse_line(raw: bytes, number: int) -> dict[str, Any]:
    """Parse and shape-check one line; raise _Stop with the problem found."""

    def stop(code: str, message: str, seq: int | None = None) -> _Stop:
        return _Stop(ChainProblem(line=number, seq=seq, code=code, message=message))

    if not raw.endswith(b"\n"):
        raise stop(
            "trailing_partial_line",
            f"line {number} does not end with a newline: the last write was cut short "
            "(or lines were passed without their terminators)",
        )
    try:
        text = raw[:-1].decode("utf-8")
    except UnicodeDecodeError:
        raise stop("malformed_json", f"line {number} is not valid UTF-8") from None
    if not text.strip():
        raise stop("malformed_json", f"line {number} is empty")
    try:
        value = parse_json(text)
    except CanonicalizationError:
        raise stop("malformed_json", f"line {number} is not valid JSON") from None
    if not isinstance(value, dict):
        raise stop("not_an_object", f"line {number} is JSON but not an object")
    if "schema" not in value:
        raise stop("missing_field", f"line {number} has no schema field")
    if value["schema"] != ENTRY_SCHEMA:
        raise stop("wrong_schema", f"line {number} is not a {ENTRY_SCHEMA} entry")
    seq = value.get("seq") if _is_seq(value.get("seq")) else None
    missing = [name for name in ENTRY_FIELDS if name not in value]
    if missing:
        raise stop("missing_field", f"line {number} lacks field(s): " + ", ".join(missing), seq)
    unknown = sorted(name for name in value if name not in ENTRY_FIELDS)
    if unknown:
        raise stop("unknown_field", f"line {number} has unknown field(s): " + ", ".join(unknown), seq)
    if seq is None:
        raise stop("bad_field", f"line {number}: seq must be an integer >= 0")
    if not is_valid_kind(value["kind"]):
        raise stop("bad_field", f"line {number}: kind must be a string of [a-z0-9_.]", seq)
    if not is_valid_at(value["at"]):
        raise stop("bad_field", f"line {number}: at must be an RFC 3339 UTC timestamp ending in Z", seq)
    if not isinstance(value["body"], dict):
        raise stop("bad_field", f"line {number}: body must be a JSON object", seq)
    for name in ("prev_hash", "entry_hash"):
        if not is_sha256_digest(value[name]):
            raise stop("bad_hash_form", f"line {number}: {name} is not sha256: + 64 lowercase hex", seq)
    try:
        recomputed = entry_hash_of(value)
        canonical_line = _render(value, ENTRY_FIELDS) + b"\n"
    except CanonicalizationError:
        message = f"line {number} holds a value with no canonical JSON form"
        raise stop("malformed_json", message, seq) from None
    if recomputed != value["entry_hash"]:
        raise stop(
            "hash_mismatch",
            f"entry seq {seq} (line {number}) was changed: its content does not match its entry_hash",
            seq,
        )
    if canonical_line != raw:
        raise stop(
            "noncanonical_line",
            f"entry seq {seq} (line {number}) is not in canonical line form: its bytes were altered",
            seq,
        )
    return value


def _later_holds_seq(rest: Iterator[str | bytes], wanted: int) -> bool:
    """Whether a later line parses to an entry with seq ``wanted`` (tells a move from a loss)."""
    for line in rest:
        try:
            value = parse_json(_as_bytes(line))
        except (CanonicalizationError, UnicodeDecodeError):
            continue
        if isinstance(value, dict) and value.get("seq") == wanted and not isinstance(value.get("seq"), bool):
            return True
    return False


def verify_chain(lines: Iterable[str | bytes], expected_head: ChainHead | None = None) -> ChainReport:
    """Verify a trace log given as its lines, each WITH its ``\\n`` (as iterating a binary file yields).

    Stops at the first problem and names its line and seq. ``expected_head`` (from a
    checkpoint) additionally demands that the log reaches that seq with that entry_hash.
    """
    head: ChainHead | None = None
    count = 0
    seen_at_checkpoint: str | None = None
    iterator = iter(lines)
    number = 0
    for line in iterator:
        number += 1
        try:
            entry = _parse_line(_as_bytes(line), number)
        except _Stop as stop:
            return ChainReport(ok=False, entries=count, head=head, first_problem=stop.problem)
        seq = entry["seq"]
        expected_seq = 0 if head is None else head.seq + 1
        problem: ChainProblem | None = None
        if seq > expected_seq:
            if _later_holds_seq(iterator, expected_seq):
                problem = ChainProblem(
                    number,
                    seq,
                    "seq_reorder",
                    f"line {number} holds entry seq {seq} where seq {expected_seq} was expected: "
                    f"entries were moved (seq {expected_seq} appears later in the file)",
                )
            else:
                missing = (
                    f"entry seq {expected_seq} is missing"
                    if seq == expected_seq + 1
                    else f"entries seq {expected_seq}..{seq - 1} are missing"
                )
                problem = ChainProblem(
                    number, expected_seq, "seq_gap", f"{missing} (line {number} holds seq {seq})"
                )
        elif seq < expected_seq:
            if head is not None and seq == head.seq and entry["entry_hash"] == head.entry_hash:
                message = f"line {number} repeats entry seq {seq} (the line before it)"
                problem = ChainProblem(number, seq, "seq_duplicate", message)
            else:
                problem = ChainProblem(
                    number,
                    seq,
                    "seq_reorder",
                    f"line {number} holds entry seq {seq} where seq {expected_seq} was expected: "
                    "entries were moved or repeated",
                )
        else:
            expected_prev = GENESIS_HASH if head is None else head.entry_hash
            if entry["prev_hash"] != expected_prev:
                what = (
                    "the genesis hash"
                    if head is None
                    else f"entry seq {head.seq}: that entry was replaced or this one was re-linked"
                )
                problem = ChainProblem(
                    number, seq, "broken_link", f"entry seq {seq} (line {number}) does not link to {what}"
                )
        if problem is not None:
            return ChainReport(ok=False, entries=count, head=head, first_problem=problem)
        head = ChainHead(seq=seq, entry_hash=entry["entry_hash"])
        count += 1
        if expected_head is not None and seq == expected_head.seq:
            seen_at_checkpoint = entry["entry_hash"]
            if seen_at_checkpoint != expected_head.entry_hash:
                return ChainReport(
                    ok=False,
                    entries=count,
                    head=head,
                    first_problem=ChainProblem(
                        number,
                        seq,
                        "checkpoint_mismatch",
                        f"entry seq {seq} (line {number}) differs from the checkpoint: "
                        f"the log was rewritten at or before seq {seq}",
                    ),
                )
    if expected_head is not None and seen_at_checkpoint is None:
        ends = "the log is empty" if head is None else f"the log ends at seq {head.seq}"
        return ChainReport(
            ok=False,
            entries=count,
            head=head,
            first_problem=ChainProblem(
                number + 1,
                None if head is None else head.seq + 1,
                "truncated",
                f"{ends} but a checkpoint records seq {expected_head.seq}: entries were cut from the end",
            ),
        )
    return ChainReport(ok=True, entries=count, head=head, first_problem=None)


def split_lines(data: bytes) -> list[bytes]:
    """Split file bytes at ``\\n`` only, keeping it (the input ``verify_chain`` expects).

    ``bytes.splitlines`` would also split at a stray ``\\r``; that byte must stay inside
    its line so that the line is reported as altered.
    """
    out: list[bytes] = []
    start = 0
    while start < len(data):
        end = data.find(b"\n", start)
        if end < 0:
            out.append(data[start:])
            break
        out.append(data[start : end + 1])
        start = end + 1
    return out
