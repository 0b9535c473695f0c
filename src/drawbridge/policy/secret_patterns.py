"""The secrets ``result_guards`` finds in what a tool returns: the built-in detectors, and the check
that an operator's own pattern is safe to run on a tool's result.

Invariant: every detector is bounded -- no unbounded repetition, so that one start position costs at
most a fixed number of steps whatever the result's size -- and anchored on the characters around it
(a token glued to more token characters is not one), to keep false positives rare. An operator's
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


def _detector(kind: str, source: str, flags: int = 0) -> Detector:
    return Detector(kind, re.compile(source, flags))


_B64 = r"[A-Za-z0-9+/=\r\n\t ]"
BUILTIN: Final = (
    # A PEM private key block (RSA, EC, OPENSSH, ENCRYPTED, PKCS#8, ...); a block cut before its END line
    # is still a key's worth of secret: the base64 after the header is taken.
    _detector(
        "pem_private_key",
        r"-----BEGIN (?:[A-Z0-9]{1,16} ){0,2}PRIVATE KEY-----"
        r"(?:[\s\S]{0,16384}?-----END (?:[A-Z0-9]{1,16} ){0,2}PRIVATE KEY-----|" + _B64 + r"{0,16384})",
    ),
    _detector("aws_access_key_id", r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
    _detector(
        "github_token",
        r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{36,251}|github_pat_[A-Za-z0-9_]{50,244})(?![A-Za-z0-9_])",
    ),
    _detector("slack_token", r"(?<![A-Za-z0-9-])xox[abprs]-[0-9]{6,16}-[A-Za-z0-9-]{8,250}(?![A-Za-z0-9-])"),
    _detector("stripe_live_key", r"(?<![A-Za-z0-9_])(?:sk|rk)_live_[A-Za-z0-9]{20,247}(?![A-Za-z0-9_])"),
    _detector("google_api_key", r"(?<![A-Za-z0-9_-])AIza[A-Za-z0-9_-]{35}(?![A-Za-z0-9_-])"),
    _detector(
        "jwt",
        r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,4096}\.eyJ[A-Za-z0-9_-]{8,8192}\.[A-Za-z0-9_-]{16,4096}(?![A-Za-z0-9_-])",
    ),
    _detector("bearer_token", r"(?<![A-Za-z0-9_-])[Bb]earer[ \t]{1,8}(?P<secret>[A-Za-z0-9._~+/-]{16,4096}=*)(?![A-Za-z0-9._~+/=-])"),
    # scheme://user:password@host: the user and password; a URL with a user and no password is not one.
    _detector(
        "url_credentials",
        r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,31}://(?P<secret>[^\s/?#@:\[\]]{1,256}:[^\s/?#@\[\]]{1,256})@",
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


__all__ = ["BUILTIN", "BUILTIN_KINDS", "KIND_NAME", "MAX_SECRET_CHARS", "Detector", "check_secret_regex"]
