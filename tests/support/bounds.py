"""Upper time bounds for tests on a loaded machine, derived from what the test configured.

The tests share two cores with other work, so a bound never sits a few hundred milliseconds
above a configured time: it allows the configured time again, and at least `SLACK` seconds.
Each bound still tells "bounded by the configured time" apart from the alternative the test
rules out (an agent's own 10 s timeout, a 30 s scripted delay, a hang).
"""

from __future__ import annotations

SLACK = 2.0  # seconds a loaded machine may add to anything


def at_most(configured: float) -> float:
    """The latest acceptable time for something configured to take `configured` seconds."""
    return configured + max(SLACK, configured)
