"""Connection counts shared by the front-end processes of ``--frontend-processes N``, so that each port's caps
(``--http-max-connections``, ``--grpc-max-connections`` and their per-address ones) hold for all of them together,
as one process holds them: the cap+1-th connection in all is refused, the same way, whichever front end took it.

One shared-memory region (a memfd the host makes and passes to each front end at spawn) and one POSIX record
lock (``fcntl.lockf``: per process, released by the kernel when a holder dies) taken only while a connection is
admitted or released: connections are rare next to requests, and nothing here runs per request. Each front end
owns a slot (its index) and counts only in its own column, so when one dies (kill -9 releases nothing) the host
clears that column before it starts the front end again. With N = 1 none of this exists (plain ``Gate``).

Layout, in int32: a header (slots, then each port's entry count); then per port, one count per slot, and its
per-address table: ``entries`` rows of (16-byte key, the blake2b of the address; one count per slot), open
addressing with linear probing, and backward-shift deletion (no tombstones to pile up as addresses come and go).
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
import tempfile

from naiad.frontends.connections import ADDRESS_FULL, PORT_FULL, Gate

PORTS = ("HTTP", "Sagemaker", "GRPC")
KEY = 16  # bytes
EMPTY = bytes(KEY)
MAX_ENTRIES = 1 << 14
HEADER = 1 + len(PORTS)  # ints


def entries_for(gate: Gate) -> int:
    """A port's per-address rows: twice the addresses its cap lets in at once (so every one finds a row and probes
    stay short), a power of two, at most MAX_ENTRIES; none without a per-address cap."""
    if not gate.per_address:
        return 0
    want = 2 * gate.limit if gate.limit else MAX_ENTRIES
    return min(MAX_ENTRIES, 1 << max(3, (want - 1).bit_length()))


def _key(address: str) -> bytes:
    return hashlib.blake2b(address.encode(), digest_size=KEY).digest()


def _home(key: bytes, mask: int) -> int:
    return int.from_bytes(key[:8], "little") & mask


class Counts:
    """The shared region, mapped: ``admit`` / ``release`` for one slot's connections, ``clear`` for a dead slot."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        slots, *entries = struct.unpack(f"{HEADER}i", os.pread(fd, 4 * HEADER, 0))
        self.slots = slots
        self.row = KEY // 4 + slots  # ints per per-address row
        self.regions: dict[str, tuple[int, int, int]] = {}  # port -> (counts, table: int offsets; rows)
        at = HEADER
        for port, rows in zip(PORTS, entries):
            self.regions[port] = (at, at + slots, rows)
            at += slots + rows * self.row
        self.map = mmap.mmap(fd, 4 * at)
        self.ints = memoryview(self.map).cast("i")

    @classmethod
    def create(cls, slots: int, entries: dict[str, int]) -> Counts:
        """A zeroed region for ``slots`` front ends, ``entries``: each port's per-address rows (``entries_for``)."""
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("naiad-connections")
        else:  # (no memfd: an unlinked file, as good once mapped)
            with tempfile.TemporaryFile() as file:
                fd = os.dup(file.fileno())
        header = [slots, *(entries.get(port, 0) for port in PORTS)]
        size = HEADER + sum(slots + rows * (KEY // 4 + slots) for rows in header[1:])
        os.ftruncate(fd, 4 * size)
        os.pwrite(fd, struct.pack(f"{HEADER}i", *header), 0)
        return cls(fd)

    def close(self) -> None:
        self.ints.release()
        self.map.close()
        os.close(self.fd)

    def _lock(self) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_EX)  # (a process's own threads don't exclude each other: one loop each)

    def _unlock(self) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_UN)

    def _find(self, table: int, rows: int, key: bytes) -> int:
        """The row holding ``key``, or the empty row it would take; -1 when every row holds another address."""
        mask, size, data = rows - 1, 4 * self.row, self.map
        index = _home(key, mask)
        for _ in range(rows):
            at = 4 * table + index * size
            held = data[at:at + KEY]
            if held == key or held == EMPTY:
                return index
            index = (index + 1) & mask
        return -1

    def admit(self, port: str, slot: int, limit: int, per_address: int, address: str | None) -> str | None:
        """As ``Gate.admit``, over every slot's connections: None, and the connection counts in ``slot``."""
        counts, table, rows = self.regions[port]
        ints, slots = self.ints, self.slots
        self._lock()
        try:
            if 0 < limit <= sum(ints[counts:counts + slots]):
                return PORT_FULL
            if per_address and address is not None and rows:
                key = _key(address)
                index = self._find(table, rows, key)
                # (Every row taken, which needs more addresses at once than the cap lets in or MAX_ENTRIES/2 of
                # them: this address goes uncounted, held to the port's cap only, the one that guards descriptors.)
                if index >= 0:
                    row = table + index * self.row
                    column = row + KEY // 4
                    if self.map[4 * row:4 * row + KEY] == EMPTY:
                        self.map[4 * row:4 * row + KEY] = key
                    elif sum(ints[column:column + slots]) >= per_address:
                        return ADDRESS_FULL
                    ints[column + slot] += 1
            ints[counts + slot] += 1
            return None
        finally:
            self._unlock()

    def release(self, port: str, slot: int, per_address: int, address: str | None) -> None:
        counts, table, rows = self.regions[port]
        ints, slots = self.ints, self.slots
        self._lock()
        try:
            if ints[counts + slot] > 0:
                ints[counts + slot] -= 1
            if per_address and address is not None and rows:
                key = _key(address)
                index = self._find(table, rows, key)
                row = table + index * self.row
                if index >= 0 and self.map[4 * row:4 * row + KEY] == key:  # (else one admitted uncounted)
                    column = row + KEY // 4
                    if ints[column + slot] > 0:
                        ints[column + slot] -= 1
                    if not any(ints[column:column + slots]):
                        self._delete(table, rows, index)
        finally:
            self._unlock()

    def _delete(self, table: int, rows: int, hole: int) -> None:
        """Empty row ``hole``, moving back each later row of its probe run that may fill it."""
        mask, size, data = rows - 1, 4 * self.row, self.map
        base = 4 * table
        index = hole
        while True:
            index = (index + 1) & mask
            at = base + index * size
            key = data[at:at + KEY]
            if key == EMPTY:
                break
            home = _home(key, mask)
            # The row stays where it is when its home lies cyclically within (hole, index].
            if (hole < home <= index) if hole < index else (home > hole or home <= index):
                continue
            data[base + hole * size:base + (hole + 1) * size] = data[at:at + size]
            hole = index
        data[base + hole * size:base + (hole + 1) * size] = bytes(size)

    def held(self, port: str) -> int:
        """The port's connections now, every slot's."""
        counts, _, _ = self.regions[port]
        return sum(self.ints[counts:counts + self.slots])

    def ahead(self, port: str, slot: int) -> bool:
        """Whether ``slot`` holds more of the port's connections than the other slots hold on average, by more than
        one: it leaves the next new connection to them a moment (naiad/frontends/acceptor.py). Read without the
        lock: a hint, as fresh as the last admit or release."""
        counts, _, _ = self.regions[port]
        slots = self.slots
        held = self.ints[counts:counts + slots]
        mine = held[slot]
        return slots > 1 and mine * (slots - 1) > sum(held) - mine + (slots - 1)

    def clear(self, slot: int) -> None:
        """Forget what ``slot`` held (its front end died: the kernel closed its connections). The per-address
        tables are rebuilt from the other slots' columns, so one that died mid-move leaves no stray row (of a row it
        had copied but not yet emptied, each column's larger count is the true one: both copies hold the same)."""
        ints, slots, size = self.ints, self.slots, 4 * self.row
        self._lock()
        try:
            for counts, table, rows in self.regions.values():
                ints[counts + slot] = 0
                if not rows:
                    continue
                kept: dict[bytes, list[int]] = {}
                for index in range(rows):
                    row = table + index * self.row
                    key = self.map[4 * row:4 * row + KEY]
                    if key == EMPTY:
                        continue
                    column = ints[row + KEY // 4:row + KEY // 4 + slots].tolist()
                    column[slot] = 0
                    if any(column):
                        seen = kept.setdefault(key, column)
                        if seen is not column:
                            kept[key] = [max(a, b) for a, b in zip(seen, column)]
                self.map[4 * table:4 * table + rows * size] = bytes(rows * size)
                for key, column in kept.items():
                    index = self._find(table, rows, key)
                    row = table + index * self.row
                    self.map[4 * row:4 * row + KEY] = key
                    ints[row + KEY // 4:row + KEY // 4 + slots] = memoryview(
                        struct.pack(f"{slots}i", *column)).cast("i")
        finally:
            self._unlock()


class SharedGate(Gate):
    """One port's admission in front end ``slot``, counted with every front end's: the same caps and answers as
    ``Gate``'s in one process. (``refusing`` stays the process's own: it guards this process's descriptors.)"""

    __slots__ = ("counts", "port", "slot")

    def __init__(self, gate: Gate, counts: Counts, port: str, slot: int) -> None:
        super().__init__(gate.limit, gate.per_address, gate.max_refusing)
        self.counts = counts
        self.port = port
        self.slot = slot

    def admit(self, address: str | None) -> str | None:
        return self.counts.admit(self.port, self.slot, self.limit, self.per_address, address)

    def release(self, address: str | None) -> None:
        self.counts.release(self.port, self.slot, self.per_address, address)
