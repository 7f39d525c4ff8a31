"""The fuzzers' one driver: send the cases in batches, and after each batch check that the server is alive and
still serves correctly. Every protocol's fuzzer (HTTP, gRPC, model control, SageMaker) runs through it."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

Outcome = TypeVar("Outcome")


class Fuzzer(Protocol[Outcome]):  # type: ignore[misc]
    def send(self, case: Any) -> Outcome: ...

    def close(self) -> None: ...


def in_batches(fuzzers: Sequence[Fuzzer[Outcome]], cases: Sequence[Any], batch: int, alive: Callable[[], bool],
               check: Callable[[], str | None]) -> tuple[list[Outcome], list[str]]:
    """Every case's outcome, and what went wrong with the server between batches (it died, or ``check`` found a
    problem). With several fuzzers each batch is shared among them and sent at once (cases meet in the server).
    The fuzzers are closed at the end."""
    outcomes: list[Outcome] = []
    health: list[str] = []
    try:
        with concurrent.futures.ThreadPoolExecutor(len(fuzzers)) as pool:
            for start in range(0, len(cases), batch):
                chunk = cases[start : start + batch]
                shares = [chunk[i :: len(fuzzers)] for i in range(len(fuzzers))]
                for done in pool.map(lambda fs: [fs[0].send(c) for c in fs[1]], zip(fuzzers, shares)):
                    outcomes += done
                if not alive():
                    health.append(f"the server died during cases {start}..{start + batch - 1}")
                    break
                problem = check()
                if problem:
                    health.append(f"after cases {start}..{start + batch - 1}: {problem}")
    finally:
        for fuzzer in fuzzers:
            fuzzer.close()
    return outcomes, health
