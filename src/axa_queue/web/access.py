"""Who may see the dashboard and act on it: signing in, sessions, CSRF and origin checks,
and the headers every answer carries.

A person signs in one of two ways:

- with the token (`--token-file`, or `AXA_QUEUE_WEB_TOKEN`), compared in constant
  time, and a name (a visible code, the `by` of their acts): a random session id goes
  in a cookie (HttpOnly, SameSite=Strict, Secure over HTTPS); the session lives in the
  app's memory for `SESSION_SECONDS`, so a restart signs everyone out;
- or behind a single sign-on proxy, through a header it sets (`trust_header`), honoured
  only on requests from its addresses (`trusted_proxies`); a request from anywhere else
  carrying it is treated as not signed in. From a proxy, the header must come once and
  name one person: a request carrying it twice, or with a comma in it (how HTTP joins
  copies of a header into one), is refused (`SignOnRefused`), since which copy is the
  proxy's would be a guess.

Every request that changes state (a POST) must carry the CSRF token of its session
(an HMAC of the session under a key made at start) and an `Origin` (or, lacking one,
`Referer`) of the dashboard's own host: a page of another site can neither read the
token nor pass the check.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.requests import Request

from ..acts import check_code
from ..errors import NotACodeError, OptionsError

__all__ = [
    "COOKIE",
    "SESSION_SECONDS",
    "Access",
    "Person",
    "SignOnRefused",
    "same_origin",
    "security_headers",
]

COOKIE = "axa_queue_session"
"""The session cookie's name."""

SESSION_SECONDS = 12 * 3600.0
"""How long a session lasts after signing in."""

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
"""No inline script or style, nothing from another host: every asset is the package's."""


def security_headers() -> list[tuple[bytes, bytes]]:
    """The headers every answer carries."""
    return [
        (b"content-security-policy", CSP.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"x-frame-options", b"DENY"),
        (b"referrer-policy", b"same-origin"),
        (b"cache-control", b"no-store"),
    ]


class SignOnRefused(Exception):
    """A request from a trusted proxy whose sign-on header does not name one person:
    it came more than once, or holds a comma. The message names the header, never its
    values."""


@dataclass(frozen=True)
class Person:
    """Who is signed in: `name` is the `by` of their acts; `session` what their CSRF
    token is made from."""

    name: str
    session: str


@dataclass
class Access:
    """How people sign in to one dashboard, and its sessions."""

    token: str | None = None
    trust_header: str | None = None
    trusted_proxies: Sequence[str] = ()
    sessions: dict[str, tuple[str, float]] = field(default_factory=dict)
    """Session id -> (name, when it ends, monotonic)."""
    key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    """What CSRF tokens are made with; new at each start."""

    def __post_init__(self) -> None:
        if self.token is not None and len(self.token) < 16:
            raise OptionsError(
                "the dashboard's token is shorter than 16 characters: make a long random one, "
                "e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'"
            )
        if self.token is None and self.trust_header is None:
            raise OptionsError(
                "the dashboard needs a way to sign in: give a token (--token-file or "
                "AXA_QUEUE_WEB_TOKEN) or a trusted header with its proxies"
            )
        if self.trust_header is not None and not self.trusted_proxies:
            raise OptionsError(
                f"the trusted header {self.trust_header!r} needs the proxy addresses it is "
                "honoured from (--trusted-proxy)"
            )
        try:
            self.networks = [ipaddress.ip_network(p, strict=False) for p in self.trusted_proxies]
        except ValueError as error:
            raise OptionsError(
                f"a trusted proxy is not an IP address or network: {error}"
            ) from None

    # --- signing in ---------------------------------------------------------------------

    def token_matches(self, given: str) -> bool:
        """Whether `given` is the token, compared in constant time."""
        if self.token is None:
            return False
        return hmac.compare_digest(given.encode(), self.token.encode())

    def open_session(self, name: str) -> str:
        """A new session for `name` (a visible code); returns its id, for the cookie."""
        check_code(name, "name")
        self._expire()
        session = secrets.token_urlsafe(32)
        self.sessions[session] = (name, time.monotonic() + SESSION_SECONDS)
        return session

    def close_session(self, session: str) -> None:
        self.sessions.pop(session, None)

    def _expire(self) -> None:
        now = time.monotonic()
        for session, (_, ends) in list(self.sessions.items()):
            if ends <= now:
                del self.sessions[session]

    def person(self, request: Request) -> Person | None:
        """Who is signed in on `request`, if anyone. Raises `SignOnRefused` when the
        trusted header, from a trusted proxy, came more than once or holds a comma."""
        if self.trust_header is not None and self.from_proxy(request):
            copies = request.headers.getlist(self.trust_header)
            if len(copies) > 1:
                raise SignOnRefused(
                    f"the sign-on header {self.trust_header} came {len(copies)} times; "
                    "the proxy must send it once (and drop any copy the client sent)"
                )
            if copies and "," in copies[0]:
                raise SignOnRefused(
                    f"the sign-on header {self.trust_header} holds a comma, as copies of "
                    "it joined into one would; the proxy must send one name, once"
                )
            name = copies[0] if copies else None
            if name is not None:
                try:
                    return Person(check_code(name, "name"), f"header:{name}")
                except NotACodeError:
                    return None
        session = request.cookies.get(COOKIE)
        if session is None:
            return None
        found = self.sessions.get(session)
        if found is None or found[1] <= time.monotonic():
            return None
        return Person(found[0], session)

    def from_proxy(self, request: Request) -> bool:
        """Whether `request` came straight from a trusted proxy's address."""
        if request.client is None:
            return False
        try:
            address = ipaddress.ip_address(request.client.host)
        except ValueError:
            return False
        return any(address in network for network in self.networks)

    # --- CSRF and origin ------------------------------------------------------------------

    def csrf(self, person: Person) -> str:
        """The CSRF token of `person`'s session."""
        return hmac.new(self.key, person.session.encode(), hashlib.sha256).hexdigest()

    def csrf_matches(self, person: Person, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.csrf(person).encode())


def same_origin(request: Request) -> bool:
    """Whether a state-changing request comes from a page of this host: its `Origin`,
    else its `Referer`, names the host the request was sent to."""
    source = request.headers.get("origin") or request.headers.get("referer")
    host = request.headers.get("host")
    if not source or not host or source == "null":
        return False
    return urlsplit(source).netloc == host
