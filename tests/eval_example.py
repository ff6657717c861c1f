"""The worked example in docs/agent.md of `kvmem eval`: `python -m tests.eval_example [ARGS...]`.

Runs the real `kvmem eval` command (built-in suite unless ARGS say otherwise) against the
scripted upstream of tests/support/upstream.py answering as a scripted agent that is
perfect except that it also stores facts stated in passing (`eager_agent`). No real model
is involved: the numbers say nothing about any model, only how to read the report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from kvmem.eval.suite import builtin_suite
from tests.support.eval_agents import eager_agent
from tests.support.upstream import ScriptedUpstream

MODEL = "scripted-eager-agent"


def main(args: list[str]) -> int:
    """Serve the scripted agent, run `kvmem eval ARGS` on it, print what it printed."""
    upstream = ScriptedUpstream().start()
    upstream.respond(MODEL, eager_agent(builtin_suite()))
    try:
        with tempfile.TemporaryDirectory() as folder:
            config = Path(folder) / "memory.yaml"
            config.write_text(
                json.dumps(
                    {
                        "memory": {
                            "agent": {
                                "provider": "openai",
                                "model": MODEL,
                                "api_base": upstream.url,
                                "api_key": "-",
                            }
                        }
                    }
                ),
                encoding="utf-8",
            )
            done = subprocess.run(
                [sys.executable, "-m", "kvmem", "eval", "--config", str(config), *args],
                cwd=folder,
                capture_output=True,
                text=True,
                timeout=300,
                env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
            )
    finally:
        upstream.stop()
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
