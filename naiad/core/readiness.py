"""Who is told when a model instance's readiness changes by itself: a worker process that died, found its device
poisoned, or came back, with no request or repository change to say so. The model host's pulse listens, so every
front-end process hears the change at once rather than at its next beat: a worker's not-ready spell (often a few
hundred milliseconds) is seen through any front end as through the host itself.

Changes may come from any thread (a restarted worker finishes its handshake in the loop's executor): a listener
must hand its work to its own loop."""

from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger("naiad")
_listeners: set[Callable[[], None]] = set()


def listen(listener: Callable[[], None]) -> None:
    _listeners.add(listener)


def forget(listener: Callable[[], None]) -> None:
    _listeners.discard(listener)


def changed() -> None:
    """An instance's readiness changed: tell every listener."""
    for listener in list(_listeners):
        try:
            listener()
        except Exception:  # noqa: BLE001 - a listener's failure is its own (its loop closed): the rest still hear
            log.debug("a readiness listener failed", exc_info=True)
