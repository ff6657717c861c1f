"""`/ui`: the memory page, its script and its stylesheet, from files shipped in the package.

The page is static but for four facts of the config it needs before its first request (the
auth mode, `memory.personalize`, `memory.review` and whether `memory.scopes` is set, so that it
shows its scope switcher without asking a server that keeps no scopes a question it must refuse);
everything it shows comes from the REST API, called by
the browser with the user's own credentials, so these routes need none. Every file is served with a
Content-Security-Policy that allows scripts and styles only from kvmem itself (no inline
script, no eval) and frames only from `ui.frame_ancestors`.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from kvmem.config import Config, UiConfig
from kvmem.server.routes import route
from kvmem.server.services import services_of

FILES = {
    "/ui": ("index.html", "text/html; charset=utf-8"),
    "/ui/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/ui/style.css": ("style.css", "text/css; charset=utf-8"),
    "/ui/icon.svg": ("icon.svg", "image/svg+xml"),
}


def content_security_policy(config: UiConfig) -> str:
    """The page's CSP: nothing from outside kvmem, no inline code, framed only where allowed."""
    return "; ".join(
        [
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "img-src 'self'",
            "connect-src 'self'",
            "form-action 'self'",
            "base-uri 'none'",
            "frame-ancestors " + " ".join(config.frame_ancestors),
        ]
    )


@cache
def _read(name: str) -> bytes:
    return resources.files("kvmem").joinpath("ui", name).read_bytes()


def render_page(config: Config) -> bytes:
    """The page, with the four config facts it needs before its first request."""
    page = _read("index.html").decode("utf-8")
    page = page.replace("{{auth_mode}}", config.auth.mode)
    page = page.replace("{{personalize}}", "true" if config.memory.personalize else "false")
    page = page.replace("{{review}}", config.memory.review)
    page = page.replace("{{scopes}}", "false" if config.memory.scopes is None else "true")
    return page.encode("utf-8")


async def serve_file(request: Request) -> Response:
    """One of the page's files, with the page's security headers."""
    config = services_of(request).config
    name, media_type = FILES[request.url.path]
    body = render_page(config) if name == "index.html" else _read(name)
    headers = {
        "Content-Security-Policy": content_security_policy(config.ui),
        "X-Content-Type-Options": "nosniff",
        # The page's address may carry a token in its fragment; never send it anywhere.
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }
    return Response(body, media_type=media_type, headers=headers)


async def redirect_to_page(request: Request) -> Response:
    """`/ui/` is `/ui`."""
    return RedirectResponse("/ui", status_code=308)


routes = [
    *(route(path, GET=serve_file) for path in FILES),
    route("/ui/", GET=redirect_to_page),
]
