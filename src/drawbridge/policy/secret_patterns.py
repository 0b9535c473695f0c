"""The secrets ``result_guards`` finds in what a tool returns: the built-in detectors, and the check
that an operator's own pattern is safe to run on a tool's result.

Invariant: every detector is bounded -- no unbounded repetition, so that one start position costs at
most a fixed number of steps whatever the result's size, and the private key block is found in linear
time (``pem_spans``) -- and anchored on the characters around it (a token glued to more token
characters is not one), to keep false positives rare. A built-in pattern begins with its literal (the
"nothing glued before it" check is a lookbehind after it), so that the regex engine skips to where the
literal is instead of trying every position; and a detector whose literals a text lacks does not run
on it at all. An operator's
pattern passes ``check_secret_regex`` (``regexes.check_regex``'s rules: no backreference, no nested
repetition) and must bound its own length, for the same reason: it is searched over a whole result,
which can be megabytes.

Theory of operation. A detector is a kind name and a compiled pattern; where it has a group named
``secret``, only that group is the secret (``Bearer <token>`` keeps ``Bearer``, a URL keeps its scheme
and host), else the whole match is. ``find_secrets`` (``gateway.pipeline.result_text``) runs them in
order; each match is replaced before the next detector runs, so a match is named once, by the first
detector that finds it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from drawbridge.policy.regexes import RegexError, check_regex, run_cost

MAX_SECRET_CHARS: Final = 4096
"""The longest match an operator's pattern may allow."""
MAX_STEPS_PER_POSITION: Final = 256
"""What one start position of an operator's pattern may cost (``regexes``' bound: a range ``{20,40}``
costs 21, a fixed count ``{32}`` 1), so that a result of n characters costs some 256 n at most."""
KIND_NAME: Final = re.compile(r"[a-z][a-z0-9_]{0,63}")
"""A detector's kind name: it is a log field and a metric label."""


@dataclass(frozen=True, slots=True)
class Detector:
    kind: str
    pattern: re.Pattern[str]
    literals: tuple[str, ...] = ()
    """Strings every match holds one of: a text holding none is not searched (a cheap prefilter)."""
    spans: Callable[[str], Iterator[tuple[int, int]]] | None = None
    """Where the secrets of a text are, for a detector a pattern alone cannot bound in linear time."""
    windowed: bool = False
    """Searched a window at a time (an operator's pattern, at most ``MAX_SECRET_CHARS`` long, may cost its
    bound at every position; the regex engine holds the GIL for a whole search, and a worker thread
    scanning a long text must let the event loop run in between)."""

    def present(self, text: str) -> bool:
        """Whether the text may hold a match: True unless no literal of the detector is in it."""
        return not self.literals or any(literal in text for literal in self.literals)


def _detector(kind: str, source: str, *literals: str) -> Detector:
    return Detector(kind, re.compile(source), literals)


PEM_BODY_CHARS: Final = 16384
"""How far after a private key's BEGIN line its END line, or its base64, is taken."""
PEM_BEGIN = re.compile(r"-----BEGIN (?:[A-Z0-9]{1,16} ){0,2}PRIVATE KEY-----")
PEM_END = re.compile(r"-----END (?:[A-Z0-9]{1,16} ){0,2}PRIVATE KEY-----")
# A body cut before its END line: base64 and whitespace, or the escapes of a JSON string written into
# text (a service account's "-----BEGIN PRIVATE KEY-----\nMIIE...\n").
_PEM_BASE64 = re.compile(r"(?:[A-Za-z0-9+/=\s]|\\[nrt]){0,%d}" % PEM_BODY_CHARS)


def pem_spans(text: str) -> Iterator[tuple[int, int]]:
    """Each private key block: its BEGIN line to its END line when that comes within ``PEM_BODY_CHARS``,
    else to the end of the base64 after it (a block cut short is still a key's worth of secret).

    Linear in the text: the next END line is found once with ``str.find`` and reused by every BEGIN
    line before it (a lazy pattern would rescan the body for each of a million BEGIN lines)."""
    position, end_at, end_stop = 0, -2, -1
    while (begin := PEM_BEGIN.search(text, position)) is not None:
        body = begin.end()
        if end_at != -1 and end_at < body:
            end_at = text.find("-----END ", body)
            while end_at != -1 and (end := PEM_END.match(text, end_at)) is None:
                end_at = text.find("-----END ", end_at + 1)
            end_stop = end.end() if end_at != -1 else -1
        if end_at != -1 and end_at - body <= PEM_BODY_CHARS:
            stop = end_stop
        else:
            cut_short = _PEM_BASE64.match(text, body)
            stop = cut_short.end() if cut_short is not None else body
        yield begin.start(), stop
        position = stop


BUILTIN: Final = (
    # A PEM private key block (RSA, EC, OPENSSH, ENCRYPTED, PKCS#8, ...): ``pem_spans``.
    Detector("pem_private_key", PEM_BEGIN, ("-----BEGIN ",), pem_spans),
    _detector("aws_access_key_id", r"A(?:KIA|SIA)(?<![A-Za-z0-9]....)[A-Z0-9]{16}(?![A-Za-z0-9])", "AKIA", "ASIA"),
    _detector(
        "github_token",
        r"g(?:h[pousr]_(?<![A-Za-z0-9_]....)[A-Za-z0-9]{36,251}|ithub_pat_(?<![A-Za-z0-9_].{11})[A-Za-z0-9_]{50,244})"
        r"(?![A-Za-z0-9_])",
        "gh", "github_pat_",
    ),
    _detector("slack_token", r"xox[abprs]-(?<![A-Za-z0-9-].{5})[0-9]{6,16}-[A-Za-z0-9-]{8,250}(?![A-Za-z0-9-])", "xox"),
    _detector("stripe_live_key", r"[sr]k_live_(?<![A-Za-z0-9_].{8})[A-Za-z0-9]{20,247}(?![A-Za-z0-9_])", "_live_"),
    _detector("google_api_key", r"AIza(?<![A-Za-z0-9_-]....)[A-Za-z0-9_-]{35}(?![A-Za-z0-9_-])", "AIza"),
    _detector(
        "jwt",
        r"eyJ(?<![A-Za-z0-9_-]...)[A-Za-z0-9_-]{8,4096}\.eyJ[A-Za-z0-9_-]{8,8192}\.[A-Za-z0-9_-]{16,4096}(?![A-Za-z0-9_-])",
        "eyJ",
    ),
    _detector("bearer_token", r"[Bb]earer(?<![A-Za-z0-9_-]......)[ \t]{1,8}(?P<secret>[A-Za-z0-9._~+/-]{16,4096}=*)(?![A-Za-z0-9._~+/=-])", "earer"),
    # scheme://user:password@host: the user and password; a URL with a user and no password is not one.
    _detector(
        "url_credentials",
        r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,31}://(?P<secret>[^\s/?#@:\[\]]{1,256}:[^\s/?#@\[\]]{1,256})@",
        "://",
    ),
)
"""The built-in detectors, in the order they run."""

BUILTIN_KINDS: Final = frozenset(detector.kind for detector in BUILTIN)


def check_secret_regex(pattern: str) -> re.Pattern[str]:
    """An operator's secret pattern, compiled once it passed the bounded-regex rules and bounds its
    own length; raises ``RegexError`` saying why not."""
    import re._parser as sre_parser

    compiled = check_regex(pattern, subject_max=MAX_SECRET_CHARS, search=False)
    low, high = sre_parser.parse(pattern).getwidth()
    if high > MAX_SECRET_CHARS:
        raise RegexError(
            f"can match more than {MAX_SECRET_CHARS} characters (give every repetition a bound, "
            "e.g. {1,64} instead of + or *)"
        )
    if low == 0:
        raise RegexError("can match the empty string")
    if run_cost(pattern, MAX_SECRET_CHARS, False) > MAX_STEPS_PER_POSITION:
        raise RegexError(
            f"could try too many ways at each position of a result (more than {MAX_STEPS_PER_POSITION}; "
            "use fewer alternatives or narrower ranges such as {20,40})"
        )
    return compiled


__all__ = [
    "BUILTIN", "BUILTIN_KINDS", "KIND_NAME", "MAX_SECRET_CHARS", "PEM_BEGIN", "PEM_BODY_CHARS", "PEM_END", "Detector", "check_secret_regex",
    "pem_spans",
]
