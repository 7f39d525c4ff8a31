"""What the repository tells those who follow it, each with the model's name, as it happens: a model that serves
now and did not (``LOAD``: a version loaded, or an entry with versions put in), one that served and does not, or
serves one version fewer (``UNLOAD``), and any other change to its entry (``CHANGE``: replaced by a reload). The
model host pushes new views to its front ends from these instead of looking for changes.

Listeners are called where the change is made, which may be a load thread: one that touches an event loop hops
onto it (``loop.call_soon_threadsafe``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from naiad.repository.manager import ModelEntry

LOAD, UNLOAD, CHANGE = "load", "unload", "change"
Listener = Callable[[str, str], None]  # (kind, model name)


class Events:
    def __init__(self) -> None:
        self.listeners: list[Listener] = []

    def listen(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def emit(self, kind: str, name: str) -> None:
        for listener in self.listeners:
            listener(kind, name)


class Entries(dict[str, "ModelEntry"]):
    """The repository's models by name: each entry put here tells ``events`` of its versions' changes, and
    putting or dropping one is a change of its own. Reads are the plain dict's (the request path's lookups)."""

    __slots__ = ("events",)

    def __init__(self, events: Events) -> None:
        super().__init__()
        self.events = events

    def __setitem__(self, name: str, entry: ModelEntry) -> None:
        old = self.get(name)
        entry.events = self.events
        super().__setitem__(name, entry)
        served, serving = old is not None and bool(old.versions), bool(entry.versions)
        self.events.emit(CHANGE if served == serving else LOAD if serving else UNLOAD, name)

    def __delitem__(self, name: str) -> None:
        served = bool(self[name].versions)
        super().__delitem__(name)
        self.events.emit(UNLOAD if served else CHANGE, name)
