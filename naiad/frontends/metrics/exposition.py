"""The Prometheus text page, from prometheus_client's default ``REGISTRY``.

prometheus_client's text exposition names every counter family ``<name>_total`` in its HELP/TYPE lines.
Triton's counters (and the samples our collectors emit) carry no such suffix, so for a counter whose
samples use the bare name the two header lines are renamed back: a scraper then sees Triton's families.

Numbers are written as Triton's prometheus-cpp (1.0.1) writes them, a stream of precision 16 (``%.16g``):
``3`` and ``le="1"`` where prometheus_client writes ``3.0`` and ``le="1.0"``, ``0.5``, ``1e-05``, ``+Inf``,
``-Inf`` and ``Nan``. Clients match on that text (Triton's QA tests do); Prometheus parsers read both.
"""

from __future__ import annotations

import math
import re

from prometheus_client import REGISTRY, generate_latest
from prometheus_client.registry import CollectorRegistry

CONTENT_TYPE = b"text/plain; charset=utf-8"  # what Triton's metrics endpoint sends


# A bound label's value; a quote inside another label's value is escaped (\"), so it cannot start a match.
_BOUND = re.compile(r'([{,](?:le|quantile)=")([^"]*)"')


def number(value: float) -> str:
    """A sample value or bound as prometheus-cpp writes it."""
    if math.isnan(value):
        return "Nan"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return "%.16g" % value


def _retext(text: str) -> str:
    try:
        return number(float(text))
    except ValueError:
        return text


def _bound(match: re.Match[str]) -> str:
    return f'{match.group(1)}{_retext(match.group(2))}"'


def _sample(line: str) -> str:
    """A sample line with its value (and le/quantile bound) in Triton's number format. Only per scrape."""
    close = line.rfind("}")
    if close >= 0:
        head, tail = line[:close + 1], line[close + 1:]
        if "le=" in head or "quantile=" in head:
            head = _BOUND.sub(_bound, head)
    else:
        space = line.find(" ")
        head, tail = line[:space], line[space:]
    parts = tail.split(" ")  # " value" or " value timestamp"
    if len(parts) > 1:
        parts[1] = _retext(parts[1])
    return head + " ".join(parts)


def render(registry: CollectorRegistry = REGISTRY) -> bytes:
    lines = generate_latest(registry).decode().split("\n")
    for i, line in enumerate(lines):
        if line and line[0] != "#":
            lines[i] = _sample(line)
            continue
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
