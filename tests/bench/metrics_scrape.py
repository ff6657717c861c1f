"""`python -m tests.bench.metrics_scrape [--series N] [--scrapes N]`: what a /metrics scrape costs.

Fills one app's registry with about N series the way traffic would (routes x methods x
statuses, histogram buckets included), then times `GET /metrics` end to end through the ASGI
app (middleware, auth, rendering) and the rendering alone, in wall time and in CPU time of
the scraping thread (on a shared, loaded machine the wall time also counts the waits for a
core; the CPU time is what the scrape itself costs). Prints a markdown table; the target is
a scrape under 5 ms with 1,000 series. Not a test: run on purpose.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from prometheus_client import generate_latest

from kvmem.config import Config
from kvmem.metrics import Metrics

TARGET_MS = 5.0
STATUSES = ("200", "201", "204", "400", "401", "403", "404", "409", "422", "502")
METHODS = ("GET", "PUT", "POST", "DELETE")


def fill(metrics: Metrics, series: int) -> int:
    """Add labelled samples until the registry exposes at least `series` series; the count."""
    route = 0
    while count_series(metrics) < series:
        template = f"/route_{route}/{{key}}"
        for method in METHODS:
            for status in STATUSES:
                metrics.http_requests.labels(route=template, method=method, status=status).inc()
        metrics.http_duration.labels(route=template).observe(0.003)
        route += 1
    for state in ("done", "failed", "timeout", "skipped", "disabled", "over_budget"):
        metrics.agent_runs.labels(state=state).inc()
    for kind in ("main", "agent"):
        metrics.upstream_call(kind, 0.2)
    return count_series(metrics)


def count_series(metrics: Metrics) -> int:
    """How many series (sample lines) a scrape exposes."""
    return sum(not line.startswith(b"#") for line in metrics.render().splitlines())


async def _get_metrics(app: Any) -> tuple[float, float]:
    """One `GET /metrics` through the app; the milliseconds it took (wall, CPU)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/metrics",
        "raw_path": b"/metrics",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    started, cpu = time.perf_counter(), time.thread_time()
    await app(scope, receive, send)
    elapsed = (time.perf_counter() - started) * 1000, (time.thread_time() - cpu) * 1000
    assert sent[0]["status"] == 200, sent
    return elapsed


def measure(series: int = 1000, scrapes: int = 200) -> dict[str, Any]:
    """p50/p99 milliseconds of a scrape (through the app) and of rendering alone."""
    import tempfile

    from kvmem.server.app import create_app

    with tempfile.TemporaryDirectory() as folder:
        config = Config.model_validate({"database": {"url": f"sqlite:///{folder}/bench.db"}})
        app = create_app(config)

        async def run() -> tuple[list[Any], list[Any], list[Any], int]:
            async with app.router.lifespan_context(app) as state:
                metrics = state["services"].metrics
                exposed = fill(metrics, series)

                async def with_state(scope: Any, receive: Any, send: Any) -> None:
                    scope["state"] = dict(state)
                    await app(scope, receive, send)

                through_app = [await _get_metrics(with_state) for _ in range(scrapes)]
                rendering = [_timed(metrics.render) for _ in range(scrapes)]
                # prometheus_client's own exposition of the same registry, for comparison.
                library = [
                    _timed(lambda: generate_latest(metrics.registry)) for _ in range(scrapes)
                ]
                return through_app, rendering, library, exposed

        through_app, rendering, library, exposed = asyncio.run(run())
    result: dict[str, Any] = {"series": exposed, "scrapes": scrapes}
    timings_of = (("scrape", through_app), ("render", rendering), ("generate_latest", library))
    for name, timings in timings_of:
        for index, clock in enumerate(("wall", "cpu")):
            values = [timing[index] for timing in timings]
            result[f"{name}_{clock}_p50_ms"] = statistics.median(values)
            result[f"{name}_{clock}_p99_ms"] = _p99(values)
    return result


def _timed(render: Any) -> tuple[float, float]:
    started, cpu = time.perf_counter(), time.thread_time()
    render()
    return (time.perf_counter() - started) * 1000, (time.thread_time() - cpu) * 1000


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=1000)
    parser.add_argument("--scrapes", type=int, default=200)
    arguments = parser.parse_args()
    result = measure(arguments.series, arguments.scrapes)
    print(f"{result['series']} series, {result['scrapes']} scrapes\n")
    print("| what | clock | p50 | p99 |\n|---|---|---:|---:|")
    for name in ("scrape", "render", "generate_latest"):
        for clock in ("wall", "cpu"):
            print(
                f"| {name} | {clock} | {result[f'{name}_{clock}_p50_ms']:.2f} ms | "
                f"{result[f'{name}_{clock}_p99_ms']:.2f} ms |"
            )
    for clock in ("wall", "cpu"):
        verdict = "PASS" if result[f"scrape_{clock}_p50_ms"] < TARGET_MS else "MISS"
        print(
            f"\ntarget: a scrape under {TARGET_MS:g} ms with 1,000 series ({clock} p50): {verdict}"
        )


if __name__ == "__main__":
    main()
