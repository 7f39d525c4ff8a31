"""The ingress's DeploymentHandles of the model deployment: per model name (Ray's multiplexed model id), one per
method, made on the model's first request. Only the ``limit`` most recently used names keep theirs: a handle
shares the deployment's router, so making one again costs little, while one kept per name ever asked for grows
the ingress without bound (a repository of very many models, a client trying names)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from naiad.ray.rpc import STREAM

CALL = "__call__"  # the model deployment's HTTP method (rpc.RPC and rpc.STREAM: its gRPC ones)
LIMIT = 4096  # names with handles kept


def for_method(handle: Any, method: str) -> Any:
    """``handle`` (of the model deployment's ``__call__``) for ``method`` instead."""
    return handle if method == CALL else handle.options(method_name=method, stream=method == STREAM)


class Handles:
    __slots__ = ("limit", "names")

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self.names: OrderedDict[str, dict[str, Any]] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def get(self, name: str, method: str) -> Any:
        """``name``'s handle for ``method``, or None when ``name`` has none (its first request, or it was dropped)."""
        methods = self.names.get(name)
        if methods is None:
            return None
        self.names.move_to_end(name)
        handle = methods.get(method)
        if handle is None:
            handle = methods[method] = for_method(methods[CALL], method)
        return handle

    def add(self, name: str, handle: Any, method: str) -> Any:
        """Keep ``handle`` (the model deployment's, for ``name``) and answer it for ``method``, dropping the least
        recently used name's when ``limit`` names have handles."""
        while len(self.names) >= self.limit:
            self.names.popitem(last=False)
        self.names[name] = {CALL: handle}
        return self.get(name, method)
