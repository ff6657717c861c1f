"""Requests from browsers and other local programs (CONTRACT section 17): which Host names
kvmem answers to, which sites may send it writes, and the headers every response carries.

Any web page the person visits can send requests to 127.0.0.1, where `local` mode trusts
whoever connects. `SiteGuardMiddleware` sits in front of every route and `/mcp` and tells a
page from the person:

- **Host** (DNS rebinding): a name outside `server.allowed_hosts` answers 403
  `host_not_allowed` before anything else runs. A page of `evil.example` whose name was
  re-pointed at 127.0.0.1 reaches kvmem with `Host: evil.example`. More than one `Host`
  header answers 400 `bad_request` (RFC 9112 section 3.2), whatever the allowlist.
- **Origin** (cross-site writes): a method other than GET/HEAD/OPTIONS with a foreign
  `Origin`, or with a `Sec-Fetch-Site` other than `same-origin`/`none`, answers 403
  `origin_not_allowed`, unless the Origin is in `server.allowed_origins`. On `/mcp` every
  method is checked, as the MCP specification asks. Clients that send neither header
  (curl, SDKs, servers) are not browsers and pass.
- **Headers**: `X-Content-Type-Options: nosniff` on every response, and
  `Cache-Control: no-store` on every response that does not choose its own caching (the
  page's static files do), so that no user's data stays in a cache.

It knows nothing of routes or users; how an error body looks is the app's choice
(`render`, which is `app.error_response`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvmem.config import Config
from kvmem.errors import BadRequest, HostNotAllowed, KvmemError, OriginNotAllowed

ANY_HOST = "*"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Paths whose every request is origin-checked, reads included (the MCP specification).
ALWAYS_CHECKED = ("/mcp",)
# What a browser's Sec-Fetch-Site says of a request made by kvmem's own page, or typed in.
OWN_FETCH_SITES = frozenset({"same-origin", "none"})
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
# Every response, whatever it holds (a JSON error included), is taken as its content type.
RESPONSE_HEADERS = {"X-Content-Type-Options": "nosniff"}
# A response that sets no caching of its own holds data of a user or of the server.
NO_STORE = {"Cache-Control": "no-store"}
# How much of a refused header a message quotes.
QUOTED_CHARS = 200

Origin = tuple[str, str, int]  # scheme, host name, port (the scheme's default when unsaid)
Render = Callable[[Request, KvmemError], Response]


@dataclass(frozen=True)
class SitePolicy:
    """Which Host names are answered (None: any) and which foreign origins may write."""

    allowed_hosts: frozenset[str] | None
    allowed_origins: frozenset[Origin]

    @classmethod
    def from_config(cls, config: Config) -> SitePolicy:
        """The policy of `server.allowed_hosts` and `server.allowed_origins`, with section
        17's defaults: the loopback names and `server.host` in `local` mode, any in `keys`."""
        hosts = config.server.allowed_hosts
        if hosts is None:
            if config.auth.mode == "keys":
                hosts = [ANY_HOST]
            else:
                hosts = [*LOOPBACK_NAMES, config.server.host.lower()]
        allowed = None if ANY_HOST in hosts else frozenset(_bracketed(host) for host in hosts)
        origins = (parse_origin(origin) for origin in config.server.allowed_origins)
        return cls(allowed, frozenset(origin for origin in origins if origin is not None))

    def check(self, scope: Scope) -> None:
        """Raise `BadRequest`, `HostNotAllowed` or `OriginNotAllowed` if the request may
        not go on."""
        headers = Headers(scope=scope)
        hosts = [value for name, value in scope["headers"] if name == b"host"]
        if len(hosts) > 1:
            # RFC 9112 section 3.2: a proxy that routes on another of them than the one
            # checked here would disagree with this check.
            raise BadRequest(
                f"the request has {len(hosts)} Host headers; HTTP/1.1 allows exactly one"
            )
        host = hosts[0].decode("latin-1") if hosts else None
        if self.allowed_hosts is not None and host_name(host or "") not in self.allowed_hosts:
            quoted = "no Host header" if host is None else f"Host {host[:QUOTED_CHARS]!r}"
            raise HostNotAllowed(
                f"{quoted} is not a name this server answers to; "
                "list it in server.allowed_hosts if it is yours"
            )
        path: str = scope["path"]
        checked = any(path == p or path.startswith(p + "/") for p in ALWAYS_CHECKED)
        if scope["method"] in SAFE_METHODS and not checked:
            return
        origin = headers.get("origin")
        sent_from = parse_origin(origin) if origin is not None else None
        if sent_from is not None and sent_from in self.allowed_origins:
            return  # a deliberate embedder: its pages are cross-site by nature
        own = own_origin(scope.get("scheme", "http"), host)
        if origin is not None and (sent_from is None or sent_from != own):
            raise OriginNotAllowed(
                f"requests from other sites are refused (Origin: {origin[:QUOTED_CHARS]}); "
                "list the site in server.allowed_origins if it should write here"
            )
        fetch_site = headers.get("sec-fetch-site")
        if fetch_site is not None and fetch_site.lower() not in OWN_FETCH_SITES:
            raise OriginNotAllowed(
                f"requests from other sites are refused (Sec-Fetch-Site: "
                f"{fetch_site[:QUOTED_CHARS]})"
            )


class SiteGuardMiddleware:
    """Applies a `SitePolicy` to every HTTP request and adds the security headers to every
    response (plain ASGI, so streams pass through untouched)."""

    def __init__(self, app: ASGIApp, policy: SitePolicy, render: Render) -> None:
        self.app = app
        self.policy = policy
        self.render = render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in (*RESPONSE_HEADERS.items(), *NO_STORE.items()):
                    if name not in headers:
                        headers[name] = value
            await send(message)

        try:
            self.policy.check(scope)
        except KvmemError as refused:
            response = self.render(Request(scope, receive), refused)
            await response(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)


def host_name(host: str) -> str:
    """The name of a Host header, lower case, without its port (`[::1]:8700` is `[::1]`)."""
    host = host.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        return host[: end + 1] if end != -1 else host
    return host.partition(":")[0]


def parse_origin(origin: str) -> Origin | None:
    """`scheme://host[:port]` as a comparable triple; None when it is not one (`null`)."""
    try:
        parts = urlsplit(origin.strip().lower())
        default = DEFAULT_PORTS.get(parts.scheme)
        if default is None or not parts.hostname or parts.path or parts.query:
            return None
        return parts.scheme, _bracketed(parts.hostname), parts.port or default
    except ValueError:  # a malformed port or bracket
        return None


def own_origin(scheme: str, host: str | None) -> Origin | None:
    """kvmem's origin as the request reached it: its scheme and its `Host`."""
    return parse_origin(f"{scheme}://{host}") if host else None


def _bracketed(name: str) -> str:
    """An IPv6 address in brackets, as a Host header writes it; other names unchanged."""
    name = name.strip().lower()
    return f"[{name}]" if ":" in name and not name.startswith("[") else name
