"""The Prometheus text page, from prometheus_client's default ``REGISTRY``.

prometheus_client's text exposition names every counter family ``<name>_total`` in its HELP/TYPE lines.
Triton's counters (and the samples our collectors emit) carry no such suffix, so for a counter whose
samples use the bare name the two header lines are renamed back: a scraper then sees Triton's families.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, generate_latest
from prometheus_client.registry import CollectorRegistry

CONTENT_TYPE = b"text/plain; charset=utf-8"  # what Triton's metrics endpoint sends


def render(registry: CollectorRegistry = REGISTRY) -> bytes:
    lines = generate_latest(registry).decode().split("\n")
    for i, line in enumerate(lines):
        if not (line.startswith("# TYPE ") and line.endswith("_total counter")) or i + 1 >= len(lines):
            continue
        name = line[len("# TYPE "):-len(" counter")]
        bare = name[: -len("_total")]
        sample = lines[i + 1]
        if sample.startswith((bare + "{", bare + " ")):
            lines[i] = f"# TYPE {bare} counter"
            if i > 0 and lines[i - 1].startswith(f"# HELP {name} "):
                lines[i - 1] = f"# HELP {bare} " + lines[i - 1][len(f"# HELP {name} "):]
    return "\n".join(lines).encode()
