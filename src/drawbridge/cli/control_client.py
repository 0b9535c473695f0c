"""The HTTP client every control-plane subcommand shares (``tools``, ``policy``, ``pins``, ``approvals``,
``grants``), and what their exit codes mean.

Invariant: the admin token is read from one place (``find_token``), sent only in the
``Authorization`` header of requests to the control plane's URL, and never printed, logged or put in
an error message; a token that could not travel in a header is refused before anything is sent, so
the HTTP library never gets to quote it.

Where the token comes from, first found wins: ``--token-file FILE``; ``DRAWBRIDGE_ADMIN_TOKEN``; with
``--config FILE``, the variable its ``auth.admin.token_env`` names, else the gateway's token file
beside the state file the configuration names; with ``--state FILE``, the token file beside it;
else ``./drawbridge.admin-token`` when it exists (beside serve's default state file). The URL is
``--url``, else ``DRAWBRIDGE_URL``, else the configuration's ``control`` listener, else
``http://127.0.0.1:8788``.

Exit codes, for every control-plane subcommand:

* 0: done;
* 1: the control plane refused or did not find it (401, 403, 404, 409, 422, and 5xx answers);
* 2: usage error (bad arguments, or a 400 answer: the request itself was malformed), or the control
  plane could not be reached (connection refused, timeout, not a drawbridge answer).

Every refusal is one line on stderr: the control plane's own message and the HTTP status, plus a
hint for an authorization failure (which environment variable to set, never its value).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar
from urllib.parse import quote, urlsplit, urlunsplit

import click
import httpx

from drawbridge.cli.output import EXIT_FAILED, EXIT_INPUT, FORMATS, display_text
from drawbridge.config import ConfigError, ControlAccess, control_access
from drawbridge.config_hosts import connectable_host
from drawbridge.gateway.runtime.admin_token import AdminTokenProblem, read_token_file, token_file_for

DEFAULT_URL: Final = "http://127.0.0.1:8788"
URL_ENV: Final = "DRAWBRIDGE_URL"
TOKEN_ENV: Final = "DRAWBRIDGE_ADMIN_TOKEN"
DEFAULT_TOKEN_FILE: Final = "drawbridge.admin-token"
"""Beside serve's default state file ``./drawbridge.db``: found when the CLI runs where serve does."""
DEFAULT_TIMEOUT: Final = 30.0
_HEADER_SAFE: Final = re.compile(r"[\x21-\x7e]+")

F = TypeVar("F", bound=Callable[..., Any])


class ControlError(click.ClickException):
    """A refusal or failure to show on stderr; ``exit_code`` per the module docstring."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED, status: int | None = None) -> None:
        super().__init__(display_text(message))
        self.exit_code = exit_code
        self.status = status

    def format_message(self) -> str:
        return self.message


def shown_url(url: str) -> str:
    """The URL without any user:password part, for messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _url_problem(url: str) -> str | None:
    """Why ``url`` cannot be the control plane's, in words that never repeat it (a password or a
    token could be in it); None when it can. The admin token goes in a header, never in the URL."""
    if url != url.strip():
        # urlsplit drops leading blanks, the HTTP library does not: refused rather than read two ways.
        return "begins or ends with whitespace: give the address without blanks around it"
    try:
        parts = urlsplit(url)
        _port = parts.port
    except ValueError:
        return "is not a valid URL (its host or port does not parse)"
    if parts.hostname and not connectable_host(parts.hostname):
        return "has a host name that cannot be looked up (an empty label, a label over 63 characters, or a character IDNA refuses)"
    if parts.scheme not in ("http", "https") or not parts.hostname or not url.isprintable():
        return "must be an http:// or https:// URL with a host"
    if "@" in parts.netloc:
        return "must not hold a user name or password: the admin token is sent as a header (DRAWBRIDGE_ADMIN_TOKEN)"
    if parts.query or parts.fragment or "?" in url or "#" in url:
        return "must not have a query or a fragment: give the control plane's address only"
    if parts.path not in ("", "/"):
        # The control plane answers at the root of its listener; a path would be sent as a prefix of
        # every route, and could hold what the user meant to keep out of the URL.
        return "must not have a path: give the control plane's address only (scheme, host and port)"
    return None


DOT_SEGMENTS: Final = ("", ".", "..")


def segment(value: str) -> str:
    """One path segment, percent-encoded so that ``/`` and ``?`` stay inside it. An empty, ``.`` or
    ``..`` segment would be read as another path (a redirect, the parent route), so it is never sent:
    the commands refuse such a name first, and this is the last guard."""
    if value in DOT_SEGMENTS:
        raise ControlError(f"{value!r} names nothing the control plane holds: give an id or a name", EXIT_INPUT)
    return quote(value, safe="")


def id_prefix(what: str) -> Callable[[click.Context, click.Parameter, str], str]:
    """An argument callback for an id or prefix as the gateway reads it (``state.ids``): anything else
    (empty, padded, ``..``) is a usage error here, never a request sent to another path than the id's."""
    from drawbridge.state.ids import InvalidId, parse_prefix

    def check(context: click.Context, parameter: click.Parameter, value: str) -> str:
        if not value.strip():
            raise click.UsageError(f"the {what} id is empty", context)
        try:
            return parse_prefix(value, what)
        except InvalidId as exc:
            raise click.UsageError(str(exc), context) from None

    return check


@dataclass(frozen=True)
class ControlClient:
    url: str
    token: str | None = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT
    token_source: str | None = None
    """Where the token was found (a variable's name or a file's path), for messages."""

    @classmethod
    def from_env(
        cls,
        url: str | None,
        env: Mapping[str, str] | None = None,
        *,
        token_file: str | None = None,
        config: str | None = None,
        state: str | None = None,
        read_token: bool = True,
    ) -> ControlClient:
        """The client for the URL and token found as the module docstring says; with ``read_token``
        false, the token is only located (``token_location``), never read nor demanded: for a command
        that tells a person where it is and sends no credential (``drawbridge console``)."""
        env = os.environ if env is None else env
        access = None
        if config is not None:
            try:
                access = control_access(config)
            except ConfigError as exc:
                raise ControlError(str(exc), EXIT_INPUT) from None
        if url is None:
            url = env.get(URL_ENV) or (access.url if access is not None else DEFAULT_URL)
        problem = _url_problem(url)
        if problem is not None:
            raise ControlError(f"--url (or {URL_ENV}) {problem}", EXIT_INPUT)
        if not read_token:
            return cls(url.rstrip("/"), None, token_source=token_location(env, token_file=token_file, access=access, state=state))
        token, source = find_token(env, token_file=token_file, access=access, state=state)
        if token is not None and _HEADER_SAFE.fullmatch(token) is None:
            raise ControlError(
                f"the admin token from {source} holds characters that cannot be sent in an HTTP header "
                "(spaces, control or non-ASCII characters); check how it was set",
                EXIT_INPUT,
            )
        return cls(url.rstrip("/"), token, token_source=source)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Any:
        """Send one request; the decoded JSON of a 2xx answer, else ``ControlError``."""
        headers = {"Accept": "application/json"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        where = shown_url(self.url)
        try:
            with httpx.Client(timeout=self.timeout, follow_redirects=False, trust_env=False) as client:
                response = client.request(method, self.url + path, json=body, params=params, headers=headers)
        except httpx.TimeoutException:
            raise ControlError(
                f"the drawbridge control plane at {where} did not answer within {self.timeout:g} s",
                EXIT_INPUT,
            ) from None
        except httpx.HTTPError as exc:
            detail = (str(exc) or type(exc).__name__)[:200]
            raise ControlError(
                f"cannot reach the drawbridge control plane at {where}: {detail} "
                f"(is the gateway running? set --url or {URL_ENV})",
                EXIT_INPUT,
            ) from None
        return self._answer(response, method, path)

    def _answer(self, response: httpx.Response, method: str, path: str) -> Any:
        status = response.status_code
        gateway = f"is {shown_url(self.url)} a drawbridge gateway?"
        try:
            payload = response.json()
        except ValueError:
            payload = None
        if 200 <= status < 300:
            if payload is None and response.content:
                raise ControlError(
                    f"{method} {path}: the answer is not JSON; {gateway}",
                    EXIT_INPUT,
                    status,
                )
            return payload
        message = payload.get("error") if isinstance(payload, dict) else None
        if not isinstance(message, str):
            if status in (404, 405) and payload is None:
                message = f"{method} {path} is not served here; {gateway}"
            else:
                message = f"{method} {path} failed"
        if status == 401:
            message += (
                f"; the admin token from {self.token_source} was refused"
                if self.token is not None
                else f"; no admin token found: {TOKEN_HINT}"
            )
        code = EXIT_INPUT if status == 400 else EXIT_FAILED
        raise ControlError(f"{message} (HTTP {status})", code, status)

    def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Mapping[str, Any] | None = None) -> Any:
        return self.request("POST", path, body=body if body is not None else {})

    def put(self, path: str, body: Mapping[str, Any]) -> Any:
        return self.request("PUT", path, body=body)

    def delete(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        return self.request("DELETE", path, params=params)


TOKEN_HINT: Final = (
    f"set {TOKEN_ENV}, or give --token-file, or --config (or --state) of the gateway, whose token file "
    "lies beside its state file"
)


def find_token(
    env: Mapping[str, str],
    *,
    token_file: str | None = None,
    access: ControlAccess | None = None,
    state: str | None = None,
) -> tuple[str | None, str | None]:
    """The admin token and where it came from (module docstring for the order); (None, None) if none."""
    if token_file is not None:
        return _from_file(token_file), token_file
    if env.get(TOKEN_ENV):
        return env[TOKEN_ENV], TOKEN_ENV
    if access is not None:
        if access.token_env is not None and env.get(access.token_env):
            return env[access.token_env], access.token_env
        if not access.token_configured:
            path = str(token_file_for(access.state_path))
            return _from_file(path), path
        held = (f"its variable {access.token_env} is not set here" if access.token_env is not None
                else "only by its hash (token_sha256), which cannot be sent")
        raise ControlError(
            f"the configuration's auth.admin names the admin token, {held}: set {TOKEN_ENV} or give --token-file",
            EXIT_INPUT,
        )
    if state is not None:
        path = str(token_file_for(state))
        return _from_file(path), path
    if os.path.exists(DEFAULT_TOKEN_FILE):
        return _from_file(DEFAULT_TOKEN_FILE), DEFAULT_TOKEN_FILE
    return None, None


def token_location(
    env: Mapping[str, str],
    *,
    token_file: str | None = None,
    access: ControlAccess | None = None,
    state: str | None = None,
) -> str | None:
    """Where ``find_token`` would look for the admin token, in its order (a file's path or a
    variable's name), without reading it or requiring that it be there; None when nothing names it."""
    if token_file is not None:
        return token_file
    if env.get(TOKEN_ENV):
        return TOKEN_ENV
    if access is not None:
        if access.token_env is not None:
            return access.token_env
        return None if access.token_configured else str(token_file_for(access.state_path))
    if state is not None:
        return str(token_file_for(state))
    return DEFAULT_TOKEN_FILE if os.path.exists(DEFAULT_TOKEN_FILE) else None


def _from_file(path: str) -> str:
    try:
        return read_token_file(path)
    except AdminTokenProblem as exc:
        raise ControlError(f"{exc} ({TOKEN_HINT})", EXIT_INPUT) from None


@dataclass(frozen=True)
class Control:
    """What a subcommand gets: the client and the output format."""

    client: ControlClient
    output_format: str

    @property
    def json(self) -> bool:
        return self.output_format == "json"


def control_options(func: F | None = None, *, formats: bool = True, read_token: bool = True) -> Any:
    """Add ``--url`` (and ``--format``) and pass a ``Control`` as the ``ctl`` argument; with
    ``read_token`` false the token is only located (``ControlClient.from_env``), and a problem with
    the options is one ``drawbridge:`` line (exit 2)."""

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def wrapper(
            *args: Any,
            url: str | None,
            token_file: str | None,
            config_path: str | None,
            state_path: str | None,
            output_format: str = "table",
            **kwargs: Any,
        ) -> Any:
            try:
                client = ControlClient.from_env(
                    url, token_file=token_file, config=config_path, state=state_path, read_token=read_token
                )
            except ControlError as exc:
                if read_token:
                    raise
                click.echo(f"drawbridge: {exc.message}", err=True)
                raise SystemExit(exc.exit_code) from None
            return f(*args, ctl=Control(client, output_format), **kwargs)

        wrapped: Any = wrapper
        if formats:
            wrapped = click.option(
                "--format",
                "output_format",
                type=click.Choice(FORMATS),
                default="table",
                show_default=True,
                help="table: for people (rich); json: the control plane's answer as JSON.",
            )(wrapped)
        wrapped = click.option(
            "--state",
            "state_path",
            metavar="FILE",
            help="The gateway's state file: its admin token file lies beside it (<stem>.admin-token).",
        )(wrapped)
        wrapped = click.option(
            "--config",
            "config_path",
            metavar="FILE",
            help="The gateway's configuration: its control listener and where its admin token is.",
        )(wrapped)
        wrapped = click.option(
            "--token-file",
            metavar="FILE",
            help=f"A file holding the admin token (else {TOKEN_ENV}, else the gateway's token file).",
        )(wrapped)
        wrapped = click.option(
            "--url",
            default=None,
            help=f"The gateway's control plane (else {URL_ENV}, else the --config's, else {DEFAULT_URL}).",
        )(wrapped)
        return wrapped  # type: ignore[no-any-return]

    return decorate(func) if func is not None else decorate


def default_person() -> str:
    """``cli:<login>``: who resolved or accepted, when ``--by`` is not given (recorded as given)."""
    try:
        import getpass

        user = getpass.getuser()
    except Exception:  # noqa: BLE001 -- no login name is not an error
        user = "unknown"
    return f"cli:{user}"


__all__ = [
    "DEFAULT_TOKEN_FILE",
    "DEFAULT_URL",
    "TOKEN_ENV",
    "URL_ENV",
    "Control",
    "ControlClient",
    "ControlError",
    "control_options",
    "default_person",
    "find_token",
    "segment",
    "shown_url",
    "token_location",
]
