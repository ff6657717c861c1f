"""MkDocs hook: the benchmark plots in the site.

The benchmarks write their plots to tests/bench/results/, where they are committed; this
publishes them under bench/ in the site (docs/performance.md links `bench/latency.png`), so
the docs show the committed plots without a second copy in docs/. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parents[2] / "tests" / "bench" / "results"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add each committed benchmark plot to the site as bench/<name>.png."""
    for plot in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"bench/{plot.name}", abs_src_path=str(plot)))
    return files
