"""The connection counts front-end processes share (naiad/frontends/shared_counts.py), driven through two mappings
of one region as two front ends would, against a plain count of what each holds. The live checks (two front-end
processes, real clients, kill -9) are in tests/test_frontend_processes.py."""

from __future__ import annotations

import random
from collections import Counter

from naiad.frontends.connections import ADDRESS_FULL, PORT_FULL, Gate
from naiad.frontends.shared_counts import MAX_ENTRIES, Counts, SharedGate, entries_for


def test_table_sizes() -> None:
    assert entries_for(Gate(1024, 256)) == 2048
    assert entries_for(Gate(1000, 5)) == 2048
    assert entries_for(Gate(3, 1)) == 8
    assert entries_for(Gate(1024, 0)) == 0  # no per-address cap: no table
    assert entries_for(Gate(1 << 20, 256)) == MAX_ENTRIES


def test_two_front_ends_share_the_caps() -> None:
    host = Counts.create(2, {"HTTP": entries_for(Gate(4, 2)), "GRPC": 0})
    a = SharedGate(Gate(4, 2), Counts(host.fd), "HTTP", 0)
    b = SharedGate(Gate(4, 2), Counts(host.fd), "HTTP", 1)
    assert a.admit("10.0.0.1") is None
    assert b.admit("10.0.0.1") is None
    assert a.admit("10.0.0.1") == ADDRESS_FULL and b.admit("10.0.0.1") == ADDRESS_FULL  # 2 from it, in all
    assert b.admit("10.0.0.2") is None
    assert a.admit(None) is None  # (a Unix socket: no address, counted against the port only)
    assert a.admit("10.0.0.3") == PORT_FULL and b.admit("10.0.0.3") == PORT_FULL  # 4 in all
    assert host.held("HTTP") == 4 and host.held("GRPC") == 0
    a.release("10.0.0.1")
    assert b.admit("10.0.0.1") is None  # b takes the place a freed, from the same address
    host.clear(1)  # b died: its three go
    assert host.held("HTTP") == 1  # a's address-less one
    assert a.admit("10.0.0.1") is None and a.admit("10.0.0.1") is None and a.admit("10.0.0.1") == ADDRESS_FULL
    assert a.admit("10.0.0.2") is None and a.admit("10.0.0.4") == PORT_FULL


def test_many_addresses_come_and_go_as_a_plain_count_says() -> None:
    """Collisions, probe runs and backward-shift deletion: 8 rows, up to 4 addresses at once, thousands of steps."""
    rng = random.Random(20)
    limit, per_address, slots = 4, 2, 3
    host = Counts.create(slots, {"GRPC": entries_for(Gate(limit, per_address))})
    gates = [SharedGate(Gate(limit, per_address), Counts(host.fd), "GRPC", slot) for slot in range(slots)]
    held: list[Counter[str]] = [Counter() for _ in range(slots)]
    addresses = [f"192.168.0.{i}" for i in range(12)]
    for step in range(5000):
        slot = rng.randrange(slots)
        address = rng.choice(addresses)
        total = sum(sum(h.values()) for h in held)
        by_address = sum(h[address] for h in held)
        if rng.random() < 0.02:
            host.clear(slot)  # a front end killed
            held[slot].clear()
        elif held[slot] and rng.random() < 0.5:
            gone = rng.choice(sorted(held[slot].elements()))
            gates[slot].release(gone)
            held[slot][gone] -= 1
            held[slot] += Counter()  # (drop zeros)
        else:
            expected = PORT_FULL if total >= limit else ADDRESS_FULL if by_address >= per_address else None
            assert gates[slot].admit(address) == expected, step
            if expected is None:
                held[slot][address] += 1
        assert host.held("GRPC") == sum(sum(h.values()) for h in held)
    for slot in range(slots):
        for address in list(held[slot].elements()):
            gates[slot].release(address)
    assert host.held("GRPC") == 0
    _, table, rows = host.regions["GRPC"]
    assert not any(host.ints[table:table + rows * host.row])  # every row emptied again


def test_a_full_table_still_holds_the_port_cap() -> None:
    host = Counts.create(1, {"HTTP": 8})
    gate = SharedGate(Gate(12, 1), host, "HTTP", 0)
    assert all(gate.admit(f"10.1.0.{i}") is None for i in range(8))  # every row taken
    assert gate.admit("10.1.0.99") is None and gate.admit("10.1.0.99") is None  # uncounted by address
    assert gate.admit("10.1.0.0") == ADDRESS_FULL  # counted ones still are
    assert all(gate.admit(f"10.2.0.{i}") is None for i in range(2))
    assert gate.admit("10.3.0.1") == PORT_FULL


def test_ahead_is_more_than_one_over_the_others_mean() -> None:
    host = Counts.create(3, {"HTTP": 0})
    gates = [SharedGate(Gate(0, 0), Counts(host.fd), "HTTP", slot) for slot in range(3)]
    assert not any(host.ahead("HTTP", slot) for slot in range(3))
    gates[0].admit(None)
    assert not host.ahead("HTTP", 0)  # one over: a connection at a time (each closed before the next) stays put
    gates[0].admit(None)
    assert host.ahead("HTTP", 0) and not host.ahead("HTTP", 1)
    gates[1].admit(None)
    gates[1].admit(None)
    assert not host.ahead("HTTP", 0)  # 2 against a mean of 1: not more than one over
    host.clear(2)
    assert not host.ahead("HTTP", 0)
    one = Counts.create(1, {"HTTP": 0})
    SharedGate(Gate(0, 0), Counts(one.fd), "HTTP", 0).admit(None)
    SharedGate(Gate(0, 0), Counts(one.fd), "HTTP", 0).admit(None)
    assert not one.ahead("HTTP", 0)  # alone, never ahead of anyone
