"""Prometheus metrics: one registry per app, the metric objects, and the HTTP middleware.

`Metrics` owns a `CollectorRegistry` of its own (never prometheus_client's global one), so
several apps in one process never share counters. `MetricsMiddleware` is plain ASGI (not
Starlette's `BaseHTTPMiddleware`, which breaks streaming and cancellation): it times each
request until its response has ended, a stream included, and labels it with the matched
route's template (`/memory/{key}`), never the raw path, so the number of series stays bounded.
It knows nothing of the store or the agent; they report to `Metrics` themselves.

Rendering is kvmem's own (the text format 0.0.4, as `prometheus_client.generate_latest`
writes it, without the `_created` series): each series' name-and-labels prefix is built once
and reused: half the cost of `generate_latest` with a thousand series.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.routing import Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# From half a millisecond to ten seconds: the memory path takes about a millisecond, a model
# call seconds; both must land in buckets that tell them apart.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# The `route` label of a request that matched no route (one label, whatever the path).
UNMATCHED = "unmatched"
# Methods get their own label; anything else a client makes up is `other` (bounded, again).
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """kvmem's metrics, in a registry of this app's own."""

    def __init__(self) -> None:
        # kvmem exports no `_created` series (a start time per series that nobody graphs);
        # prometheus_client can only stop making them process-wide, and making them is a
        # third of a scrape's cost. Counters and registries stay per app.
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=False)
        self._prefixes: dict[tuple[str, ...], str] = {}
        self._prefixes_lock = threading.Lock()
        registry = self.registry
        self.http_requests = Counter(
            "kvmem_http_requests",
            "HTTP requests answered, by route template, method and status.",
            ["route", "method", "status"],
            registry=registry,
        )
        self.http_duration = Histogram(
            "kvmem_http_request_duration_seconds",
            "Time from a request's arrival until its response ended (streams included).",
            ["route"],
            buckets=BUCKETS,
            registry=registry,
        )
        self.upstream_duration = Histogram(
            "kvmem_upstream_duration_seconds",
            "Duration of model calls: main (the chat) or agent (the memory agent).",
            ["kind"],
            buckets=BUCKETS,
            registry=registry,
        )
        self.task_calls = Counter(
            "kvmem_task_calls",
            "A front end's own calls (title, tags, ...): no memory, no agent run, by task.",
            ["task"],
            registry=registry,
        )
        self.agent_runs = Counter(
            "kvmem_agent_runs",
            "Chat requests by the memory agent's final state.",
            ["state"],
            registry=registry,
        )
        self.agent_tokens = Counter(
            "kvmem_agent_tokens",
            "Tokens the memory agent's model calls used (input or output).",
            ["direction"],
            registry=registry,
        )
        self.memory_writes = Counter(
            "kvmem_memory_writes",
            "Memory writes made by this process, by source and operation.",
            ["source", "op"],
            registry=registry,
        )
        self.errors = Counter(
            "kvmem_errors",
            "Errors by code: error responses, agent failures, lost usage records.",
            ["code"],
            registry=registry,
        )
        self.upstream_surrogates = Counter(
            "kvmem_upstream_lone_surrogates",
            "Lone UTF-16 surrogates in model answers, replaced with U+FFFD, by kind of call.",
            ["kind"],
            registry=registry,
        )
        self.agent_in_flight = Gauge(
            "kvmem_agent_runs_in_flight",
            "Memory agent runs working now.",
            registry=registry,
        )

    def render(self) -> bytes:
        """The metrics in Prometheus' text format (0.0.4)."""
        lines: list[str] = []
        add = lines.append
        prefixes = self._prefixes
        for family in self.registry.collect():
            name = f"{family.name}_total" if family.type == "counter" else family.name
            add(f"# HELP {name} {_escape_help(family.documentation)}\n")
            add(f"# TYPE {name} {family.type}\n")
            for sample_name, labels, value, *_ in family.samples:
                if sample_name.endswith("_created"):
                    continue  # a process start time per series; nobody graphs it
                key = (sample_name, *labels.values())
                prefix = prefixes.get(key)
                if prefix is None:
                    prefix = _series_prefix(sample_name, labels)
                    with self._prefixes_lock:  # scrapes may run side by side
                        prefixes[key] = prefix
                add(prefix)
                add(_number(value))
        return "".join(lines).encode()

    def upstream_call(self, kind: str, seconds: float) -> None:
        """Note one model call of `kind` (`main` or `agent`) that took `seconds`."""
        self.upstream_duration.labels(kind=kind).observe(seconds)

    def lone_surrogates(self, kind: str, count: int) -> None:
        """Note `count` lone surrogates replaced in an answer to a call of `kind`."""
        self.upstream_surrogates.labels(kind=kind).inc(count)

    def memory_write(self, source: str, op: str, count: int = 1) -> None:
        """Note `count` memory writes (`op`: set, delete, clear, import) from `source`."""
        self.memory_writes.labels(source=source, op=op).inc(count)

    def error(self, code: str) -> None:
        """Note one error with this code."""
        self.errors.labels(code=code).inc()


def _series_prefix(name: str, labels: dict[str, str]) -> str:
    """`name{label="value",...} ` with the values escaped as the text format wants."""
    if not labels:
        return f"{name} "
    pairs = ",".join(f'{key}="{_escape_label(value)}"' for key, value in labels.items())
    return f"{name}{{{pairs}}} "


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    """A sample value and the line's end (Go's float spelling for the infinities and NaN)."""
    if math.isinf(value):
        return "+Inf\n" if value > 0 else "-Inf\n"
    if math.isnan(value):
        return "NaN\n"
    return f"{value!r}\n"


def route_template(scope: Scope) -> str:
    """The template of the route that handled the request (`/memory/{key}`), or `unmatched`.

    Starlette's router puts the matched route in the scope. Inside a mounted router the
    route's path is relative to the mount, whose matched prefix is in `root_path`.
    """
    route = scope.get("route")
    path = getattr(route, "path", None)
    if route is None or path is None:
        return UNMATCHED
    if isinstance(route, Mount):  # a mounted app that is not a router (static files, ...)
        return path or "/"
    prefix = scope.get("root_path", "")[len(scope.get("app_root_path", "")) :]
    return f"{prefix}{path}" or "/"


class MetricsMiddleware:
    """Counts and times every HTTP request by route template, method and status, and hands
    each ended request to `on_end` (`kvmem serve`'s request log): one wrapper of `send` per
    request, not one per concern."""

    def __init__(
        self,
        app: ASGIApp,
        metrics: Metrics,
        on_end: Callable[[Scope, int, float], None] | None = None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.on_end = on_end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: int | None = None
        started = time.perf_counter()

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            # No response started: the app raised, and the server error middleware outside
            # this one answers 500. A client that left mid-stream keeps the status sent.
            self._note(scope, status or 500, time.perf_counter() - started)

    def _note(self, scope: Scope, status: int, seconds: float) -> None:
        route = route_template(scope)
        method = scope["method"] if scope["method"] in METHODS else "other"
        self.metrics.http_requests.labels(route=route, method=method, status=str(status)).inc()
        self.metrics.http_duration.labels(route=route).observe(seconds)
        if self.on_end is not None:
            self.on_end(scope, status, seconds)
