"""Model calls straight to an upstream that speaks the OpenAI API, over pooled aiohttp sessions.

`DirectClient` is the direct path `model_client.py` chooses for `openai/...` models and custom
endpoints: it posts the request to `<api_base>/chat/completions` and hands back the upstream's
own JSON (non-streamed) or its SSE events (streamed) as dicts, parsed and nothing else. No
field is added, dropped or rewritten, so `reasoning_content`, `usage.*_details`,
`system_fingerprint` and fields no library knows yet reach the client as the upstream sent
them. Errors come out as the same kvmem errors `LiteLLMClient` (litellm_client.py) raises;
what the two share is in upstream/base.py, the only kvmem client module this one imports.

It knows nothing of litellm and does not choose which targets it serves.

aiohttp rather than httpx: httpcore's pool scans every pooled connection (a poll of each
socket) whenever a request starts or ends, and its HTTP/1.1 parser (h11) is pure Python;
client-side, at 32 requests in flight against a 20 ms upstream, httpx cost 4.4-5.2 CPU ms a
request and aiohttp 0.36 ms (same machine, same run).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import os
import ssl
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from kvmem.errors import (
    KvmemError,
    UpstreamError,
    UpstreamRateLimited,
    UpstreamRejected,
    UpstreamTimeout,
)
from kvmem.upstream.base import (
    CLIENT_FAULTS,
    TIMEOUT_SLACK,
    UPSTREAM_KEEPALIVE_SECONDS,
    Target,
    UpstreamClient,
    connect_reason,
    openai_error_fields,
    plain_text,
    timeout_message,
    unreachable_message,
)
from kvmem.upstream.redaction import SecretScrubber
from kvmem.upstream.surrogates import ChunkSurrogates, clean_answer, may_hold_surrogates

OPENAI_BASE = "https://api.openai.com/v1"
# An answer larger than this is cut off with an error rather than held in memory.
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
# How much of a non-JSON error body is quoted in kvmem's message.
MAX_QUOTED_CHARS = 300


class DirectClient(UpstreamClient):
    """Calls OpenAI-compatible `/chat/completions` endpoints over pooled `aiohttp` sessions."""

    def __init__(
        self,
        scrubber: SecretScrubber | None = None,
        on_call: Callable[[str, float], None] | None = None,
        *,
        max_connections: int = 100,
        on_surrogates: Callable[[str, int], None] | None = None,
    ) -> None:
        super().__init__(scrubber, on_call, on_surrogates)
        self._max_connections = max_connections
        # One pool per kind of call (main, agent), each of `max_connections`, so that agent
        # runs never wait for a connection the main calls hold (or the reverse).
        self._pools: dict[str, aiohttp.ClientSession] = {}
        self._ssl: ssl.SSLContext | None = None
        # Per upstream base URL: where its requests go (`_Route`).
        self._routes: dict[str, _Route] = {}
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}

    def _pool(self, kind: str) -> aiohttp.ClientSession:
        pool = self._pools.get(kind)
        if pool is None:
            if self._ssl is None:
                self._ssl = tls_context()
            pool = self._pools[kind] = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self._max_connections,
                    limit_per_host=0,
                    keepalive_timeout=UPSTREAM_KEEPALIVE_SECONDS,
                    ssl=self._ssl,
                ),
                # No cookies kept: a cookie one user's call received is never sent on another's.
                cookie_jar=aiohttp.DummyCookieJar(),
                # The environment's proxies are read once per URL (`_route`); trust_env would
                # read them, and look for a .netrc, on every request.
                trust_env=False,
            )
        return pool

    async def aclose(self) -> None:
        """Close the pools (at shutdown)."""
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.close()

    async def complete(
        self, target: Target, messages: list[dict[str, Any]], user_id: str, **request: Any
    ) -> dict[str, Any]:
        """One non-streamed completion: the upstream's `chat.completion` JSON as a dict."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(target.timeout + TIMEOUT_SLACK):
                body = await self._complete(target, messages, user_id, request)
        except TimeoutError as exc:
            raise UpstreamTimeout(timeout_message(target)) from exc
        finally:
            self._timed(target, started)
        if not isinstance(body, dict) or not body.get("choices"):
            raise UpstreamError(
                "the model call failed: the answer has no choices (a malformed response)",
                upstream_status=200,
            )
        return body

    async def _complete(
        self, target: Target, messages: list[dict[str, Any]], user_id: str, request: dict[str, Any]
    ) -> Any:
        try:
            async with self._pool(target.kind).post(
                **self._arguments(target, messages, user_id, request)
            ) as response:
                data = await _read_capped(response)
                if response.status != 200:
                    raise self._status_error(response, data)
        except TimeoutError as exc:  # aiohttp's connect and read timeouts are TimeoutErrors
            raise UpstreamTimeout(timeout_message(target)) from exc
        except aiohttp.ClientError as exc:
            raise self._transport_error(target, exc) from exc
        try:
            body = json.loads(data)
        except ValueError as exc:
            raise UpstreamError(
                "the model call failed: the answer is not JSON (a malformed response)",
                upstream_status=200,
            ) from exc
        if may_hold_surrogates(data):
            body, replaced = clean_answer(body)
            self._replaced(target, replaced)
        return body

    async def stream(
        self, target: Target, messages: list[dict[str, Any]], user_id: str, **request: Any
    ) -> AsyncIterator[dict[str, Any]]:
        """A streamed completion: the upstream's `chat.completion.chunk` events as dicts, each
        as it arrives."""
        arguments = self._arguments(target, messages, user_id, {**request, "stream": True})
        started = time.perf_counter()
        response: aiohttp.ClientResponse | None = None
        try:
            try:
                async with asyncio.timeout(target.timeout + TIMEOUT_SLACK):
                    response = await self._pool(target.kind).post(**arguments)
                    if response.status != 200:
                        raise self._status_error(response, await _read_capped(response))
            except TimeoutError as exc:
                raise UpstreamTimeout(timeout_message(target)) from exc
            events = 0
            surrogates = ChunkSurrogates()
            async for payload in _sse_payloads(response):
                event = _event(payload)
                self._replaced(target, surrogates.clean(event, may_hold_surrogates(payload)))
                if isinstance(event.get("error"), dict) and not event.get("choices"):
                    raise self._stream_error(event["error"])
                events += 1
                yield event
            tail, replaced = surrogates.finish()
            if tail is not None:
                self._replaced(target, replaced)
                yield tail
            # Not one event: the body was not an event stream, which a client would take
            # for a complete, empty answer.
            if not events:
                raise UpstreamError(
                    "the model call failed: the stream held no chunks (a malformed response)",
                    upstream_status=200,
                )
        except TimeoutError as exc:
            raise UpstreamTimeout(timeout_message(target)) from exc
        except aiohttp.ClientError as exc:
            raise self._transport_error(target, exc) from exc
        finally:
            self._timed(target, started)
            if response is not None:
                # Back to the pool when the body was read to its end; otherwise (an error,
                # `[DONE]` before the body's end, the client gone) the connection is closed,
                # which cancels the upstream's work. Synchronous: nothing to shield.
                response.release()

    def _arguments(
        self, target: Target, messages: list[dict[str, Any]], user_id: str, request: dict[str, Any]
    ) -> dict[str, Any]:
        body: dict[str, Any] = {**target.parameters, **request}
        body.update(model=upstream_model(target.model), messages=messages)
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        # As the OpenAI SDK (and litellm) do: without a configured key or base URL, the
        # environment's OPENAI_API_KEY and OPENAI_BASE_URL (or OPENAI_API_BASE, `api_base`).
        api_key = target.api_key or os.environ.get("OPENAI_API_KEY")
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        headers.update(target.headers_for(user_id))
        route = self._route(api_base(target))
        if route.basic_auth is not None:  # as httpx: the URL's user:password wins
            headers["Authorization"] = route.basic_auth
        return {
            "url": route.url,
            "data": json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode(),
            "headers": headers,
            "timeout": self._timeout(target.timeout),
            "proxy": route.proxy,
            "proxy_auth": route.proxy_auth,
            "allow_redirects": False,  # a redirect would resend the key to wherever it points
        }

    def _route(self, api_base: str) -> _Route:
        """Where requests under `api_base` go (read once per URL)."""
        route = self._routes.get(api_base)
        if route is None:
            route = self._routes[api_base] = _Route.of(api_base)
        return route

    def _timeout(self, seconds: float) -> aiohttp.ClientTimeout:
        """Like httpx's single timeout: for a connection (from the pool or new) and for each
        read; the request as a whole is bounded by the `asyncio.timeout` around it."""
        timeout = self._timeouts.get(seconds)
        if timeout is None:
            timeout = self._timeouts[seconds] = aiohttp.ClientTimeout(
                total=None, connect=seconds, sock_read=seconds
            )
        return timeout

    def _status_error(self, response: aiohttp.ClientResponse, data: bytes) -> KvmemError:
        """The kvmem error for an upstream's non-200 answer."""
        status = response.status
        upstream = _error_object(data, self.scrubber.scrub)
        if upstream is not None and isinstance(upstream.get("message"), str):
            message = upstream["message"]
        else:
            text = data.decode("utf-8", "replace").strip()[:MAX_QUOTED_CHARS]
            message = self.scrubber.scrub(f"HTTP {status}: {text}" if text else f"HTTP {status}")
        if status == 429:
            return UpstreamRateLimited(
                f"the model is rate limited: {message}",
                retry_after=response.headers.get("retry-after"),
            )
        if status in CLIENT_FAULTS:
            return UpstreamRejected(
                f"the model refused the request: {message}", status=status, upstream=upstream
            )
        return UpstreamError(f"the model call failed: {message}", upstream_status=status)

    def _stream_error(self, error: dict[str, Any]) -> KvmemError:
        """An error event in a started stream (OpenAI sends `data: {"error": {...}}`)."""
        message = error.get("message") if isinstance(error.get("message"), str) else None
        return UpstreamError(
            f"the model call failed: {self.scrubber.scrub(message or json.dumps(error))}",
            upstream_status=200,
        )

    def _transport_error(self, target: Target, exc: aiohttp.ClientError) -> KvmemError:
        """A connection that failed, broke or answered with what is not HTTP."""
        if isinstance(exc, aiohttp.ClientConnectorError):  # no connection was made
            url = self.scrubber.scrub(str(self._route(api_base(target)).url))
            return UpstreamError(
                unreachable_message(target, url, self.scrubber.scrub(connect_reason(exc))),
                upstream_status=None,
            )
        if isinstance(exc, _ResponseTooLarge):
            return UpstreamError(f"the model call failed: {exc}", upstream_status=200)
        if isinstance(exc, aiohttp.ClientResponseError):
            # Its str() names the URL, which may carry credentials (user:password@host).
            detail = exc.message or type(exc).__name__
        else:
            detail = str(exc) or type(exc).__name__
        # No status came back (litellm puts a stand-in 500 here); null says so.
        return UpstreamError(
            f"the model call failed: {self.scrubber.scrub(plain_text(detail))}",
            upstream_status=None,
        )


class _Route(NamedTuple):
    """Where the requests under one base URL go."""

    url: URL  # `<api_base>/chat/completions`, without user:password
    basic_auth: str | None  # the Authorization header the URL's user:password make
    proxy: URL | None  # HTTPS_PROXY/HTTP_PROXY, unless NO_PROXY exempts the host
    proxy_auth: aiohttp.BasicAuth | None

    @classmethod
    def of(cls, api_base: str) -> _Route:
        url = URL(api_base.rstrip("/") + "/chat/completions")
        basic_auth = None
        if url.user is not None or url.password is not None:
            userpass = f"{url.user or ''}:{url.password or ''}".encode()
            basic_auth = "Basic " + base64.b64encode(userpass).decode("ascii")
            url = url.with_user(None)
        try:
            proxy, proxy_auth = get_env_proxy_for_url(url)
        except LookupError:
            proxy, proxy_auth = None, None
        return cls(url, basic_auth, proxy, proxy_auth)


class _ResponseTooLarge(aiohttp.ClientError):
    """The upstream's answer grew past `MAX_RESPONSE_BYTES`."""


def api_base(target: Target) -> str:
    """The base URL `target`'s requests go to. As the OpenAI SDK (and litellm) do: without a
    configured one, the environment's OPENAI_BASE_URL (or OPENAI_API_BASE), else OpenAI's."""
    return (
        target.api_base
        or os.environ.get("OPENAI_BASE_URL")
        or os.environ.get("OPENAI_API_BASE")
        or OPENAI_BASE
    )


def upstream_model(model: str) -> str:
    """The model name the upstream knows: litellm's `openai/` routing prefix removed."""
    return model.removeprefix("openai/")


def tls_context() -> ssl.SSLContext:
    """The TLS context httpx (and so the OpenAI SDK) would use: SSL_CERT_FILE or SSL_CERT_DIR
    when set, else certifi's CA bundle. One per process for the same settings: reading the
    CA bundle costs ~20 ms of CPU, which every client (an app's, `kvmem eval`'s, a test's)
    paid again, and a context is safe to share between connectors."""
    return _tls_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@functools.cache
def _tls_context(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    import certifi  # imported when the first pool is made, not at startup

    if cafile:
        return ssl.create_default_context(cafile=cafile)
    if capath:
        return ssl.create_default_context(capath=capath)
    return ssl.create_default_context(cafile=certifi.where())


async def _read_capped(response: aiohttp.ClientResponse) -> bytes:
    """The whole body, or `_ResponseTooLarge` once it passes `MAX_RESPONSE_BYTES`."""
    parts: list[bytes] = []
    size = 0
    async for part in response.content.iter_any():
        size += len(part)
        if size > MAX_RESPONSE_BYTES:
            raise _ResponseTooLarge(f"the answer is larger than {MAX_RESPONSE_BYTES} bytes")
        parts.append(part)
    return b"".join(parts)


async def _sse_payloads(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The data of each event of an SSE body as it arrives, up to `[DONE]`; the body as a
    whole is held to `MAX_RESPONSE_BYTES`, like a non-streamed answer."""
    pending = b""
    data: list[bytes] = []
    size = 0
    async for part in response.content.iter_any():
        size += len(part)
        if size > MAX_RESPONSE_BYTES:
            raise _ResponseTooLarge(f"the answer is larger than {MAX_RESPONSE_BYTES} bytes")
        pending += part
        *lines, pending = pending.split(b"\n")
        for line in lines:
            line = line.rstrip(b"\r")
            if line.startswith(b"data:"):
                data.append(line[5:].lstrip(b" "))
            elif not line and data:  # a blank line ends the event
                payload = b"\n".join(data)
                data = []
                if payload == b"[DONE]":
                    return
                yield payload
    if data and (payload := b"\n".join(data)) != b"[DONE]":
        yield payload


def _event(payload: bytes) -> dict[str, Any]:
    try:
        event = json.loads(payload)
    except ValueError as exc:
        raise UpstreamError(
            "the model call failed: a stream event is not JSON (a malformed response)",
            upstream_status=200,
        ) from exc
    if not isinstance(event, dict):
        raise UpstreamError(
            "the model call failed: a stream event is not an object (a malformed response)",
            upstream_status=200,
        )
    return event


def _error_object(data: bytes, scrub: Callable[[str], str]) -> dict[str, Any] | None:
    """The upstream's OpenAI error object (`message`, `type`, `param`, `code`), scrubbed."""
    try:
        body = json.loads(data)
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, str):  # some servers (Ollama, llama.cpp) send a bare message
        return {"message": scrub(error)}
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return None
    return openai_error_fields(error, scrub)
