"""Triton's sequence batcher: every request carries a correlation id; a sequence is bound to one slot of one
instance from its START to its END, so its requests run in order on the instance that holds its state.

Each instance ("lane") has slots: ``max_batch_size`` of them with the ``direct`` strategy, where slot *i* is
always row *i* of the batch and empty rows below the highest busy one are filled with not-READY padding
requests; ``oldest.max_candidate_sequences`` with the ``oldest`` strategy, where a batch takes the sequences
whose next request is oldest, up to ``max_batch_size``, with ``preferred_batch_size`` and
``max_queue_delay_microseconds`` as the dynamic batcher reads them. Sequences beyond the slots wait in a
backlog. A sequence idle for ``max_sequence_idle_microseconds`` loses its slot.

The model sees the control inputs (START / END / READY / CORRID) and the implicit state inputs added to each
request; a state output it returns becomes the sequence's next state (and leaves the response unless the
config also declares it as an output).

Cancellation, as Triton's: a sequence whose next request was cancelled (its client went away) is force-ended
when that request's turn comes. Neither it nor the requests queued behind it run; each is answered CANCELLED
(counted for the CANCELED reason), the slot goes to the backlog, and a later request with that correlation id
must START a new sequence. A backlogged sequence holding a cancelled request is dropped the same way when a slot
would go to it.

Iterative sequences (``iterative_sequence: true``, Triton's IterativeSequencer): a request without a correlation
id becomes a sequence of its own (a fresh id, START); a request the model releases with RESCHEDULE goes back to
its sequence's queue with no START or END and runs again, keeping the slot and the state; a request released for
good ends its sequence.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

import numpy as np

from naiad.backends.base import Execution, Instance
from naiad.config import ModelConfig
from naiad.config.sequence import SequenceSpec, sequence_spec
from naiad.core.errors import invalid
from naiad.core.request import InferRequest
from naiad.core.stats import ModelStats
from naiad.scheduling.dynamic import BatchKey
from naiad.scheduling.execution import Done, drop_cancelled, now_ns, record, run
from naiad.scheduling.rate_limiter import RateLimiter

log = logging.getLogger("naiad.scheduling")

START, END = 1, 2


class Sequence:
    __slots__ = ("corrid", "lane", "slot", "queue", "state", "last_ns", "running")

    def __init__(self, corrid: int | str) -> None:
        self.corrid = corrid
        self.lane: Lane | None = None
        self.slot = -1
        self.queue: deque[tuple[InferRequest, Done]] = deque()
        self.state: dict[str, np.ndarray] = {}
        self.last_ns = 0
        self.running = 0


class Lane:
    """One instance and its sequence slots."""

    __slots__ = ("instance", "slots", "busy", "soon", "timer")

    def __init__(self, instance: Instance, slots: int) -> None:
        self.instance = instance
        self.slots: list[Sequence | None] = [None] * slots
        self.busy = False
        self.soon = False
        self.timer: asyncio.TimerHandle | None = None


class SequenceBatcher:
    def __init__(self, config: ModelConfig, instances: list[Instance], stats: ModelStats,
                 limiter: RateLimiter | None = None, spec: SequenceSpec | None = None) -> None:
        batching = config.sequence_batching
        self._model = config.name
        self._stats = stats
        self._limiter = limiter
        self._spec = spec or sequence_spec(config)
        self._oldest = batching.HasField("oldest")
        self._max_batch = max(config.max_batch_size, 1)
        if self._oldest:
            slots = batching.oldest.max_candidate_sequences or self._max_batch
            self._preferred = frozenset(batching.oldest.preferred_batch_size)
            self._delay_ns = batching.oldest.max_queue_delay_microseconds * 1000
            self._utilization = 0.0
        else:
            slots = self._max_batch
            self._preferred = frozenset()
            self._delay_ns = batching.direct.max_queue_delay_microseconds * 1000
            self._utilization = batching.direct.minimum_slot_utilization
        self._lanes = [Lane(instance, slots) for instance in instances]
        self._idle_ns = (batching.max_sequence_idle_microseconds or 1_000_000) * 1000
        self._iterative = batching.iterative_sequence
        self._next_id = 1  # the ids iterative scheduling gives requests that carry none (as Triton's, from 1)
        self._key = BatchKey(config)
        self._declared_outputs = {o.name for o in config.output}
        self._sequences: dict[int | str, Sequence] = {}  # correlation id -> sequence still taking requests
        self._backlog: deque[Sequence] = deque()
        self._queued = 0
        self._reaper: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def pending(self) -> int:
        return self._queued + sum(1 for lane in self._lanes if lane.busy)

    def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for lane in self._lanes:
            if lane.timer is not None:
                lane.timer.cancel()

    # --- admission ----------------------------------------------------------------------------------------------

    def enqueue(self, request: InferRequest, done: Done) -> None:
        name = self._model
        if request.batch_size > 1:
            raise invalid(f"inference request to model '{name}' must specify batch-size 1 due to requirements of "
                          "sequence batcher")
        corrid = request.correlation_id
        if (corrid == 0 or corrid == "") and self._iterative:
            corrid = request.correlation_id = self._next_id
            self._next_id += 1
            request.flags = START
        if corrid == 0 or corrid == "":
            raise invalid(f"inference request to model '{name}' must specify a non-zero or non-empty correlation ID")
        flags = request.flags
        sequence = self._sequences.get(corrid)
        if sequence is None:
            if not flags & START:
                raise invalid(f"inference request for sequence {corrid} to model '{name}' must specify the START "
                              "flag on the first request of the sequence")
            sequence = Sequence(corrid)
            self._sequences[corrid] = sequence
            if not self._assign(sequence):
                self._backlog.append(sequence)
        elif flags & START:
            log.warning("sequence %s for model '%s' has a conflict. The previous sequence did not end before this "
                        "sequence start. Previous sequence will be terminated early.", corrid, name)
        if flags & END:
            # A later START with this id begins a new sequence, even while this one still drains.
            del self._sequences[corrid]
        sequence.queue.append((request, done))
        sequence.last_ns = request.arrival_ns
        self._queued += 1
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        if self._reaper is None:
            self._reaper = self._loop.call_later(self._idle_ns / 1e9, self._reap)
        lane = sequence.lane
        if lane is not None and not lane.busy and not lane.soon:
            lane.soon = True
            self._loop.call_soon(self._run, lane)

    def _assign(self, sequence: Sequence) -> bool:
        """Give a sequence a free slot: the lowest slot index first, spreading sequences over the instances."""
        best: tuple[int, int] | None = None
        for li, lane in enumerate(self._lanes):
            for si, holder in enumerate(lane.slots):
                if holder is None:
                    if best is None or si < best[1]:
                        best = (li, si)
                    break
        if best is None:
            return False
        lane = self._lanes[best[0]]
        lane.slots[best[1]] = sequence
        sequence.lane = lane
        sequence.slot = best[1]
        return True

    def _release(self, sequence: Sequence) -> None:
        lane = sequence.lane
        if lane is None:
            return
        lane.slots[sequence.slot] = None
        sequence.lane = None
        self._forget(sequence)
        while self._backlog:
            waiting = self._backlog.popleft()
            if any(request.cancelled for request, _ in waiting.queue):
                self._cancel(waiting)  # Triton drops a backlogged sequence with a cancelled request whole
                continue
            self._assign(waiting)  # a slot was just freed, so this succeeds
            if waiting.queue and waiting.lane is not None:
                self._wake(waiting.lane)
            return

    def _forget(self, sequence: Sequence) -> None:
        """Its correlation id no longer names it: a later request with that id must START a new sequence."""
        if self._sequences.get(sequence.corrid) is sequence:
            del self._sequences[sequence.corrid]

    def _cancel(self, sequence: Sequence) -> None:
        """Force-end a sequence because a request of it was cancelled: what it has queued is answered CANCELLED
        without running (none of it runs while the lane is idle), and its slot is released."""
        queue, sequence.queue = sequence.queue, deque()
        self._queued -= len(queue)
        log.debug("sequence %s of model '%s' was cancelled: ending it", sequence.corrid, self._model)
        if sequence.lane is not None:
            self._release(sequence)
        else:
            self._forget(sequence)
        for request, done in queue:
            request.cancelled = True  # those behind the cancelled one go with it
            drop_cancelled(request, done)

    def _wake(self, lane: Lane) -> None:
        if not lane.soon and self._loop is not None:
            lane.soon = True
            self._loop.call_soon(self._run, lane)

    def _reap(self) -> None:
        """Release the slots of sequences idle longer than max_sequence_idle_microseconds."""
        self._reaper = None
        now = now_ns()
        nearest = 0
        for lane in self._lanes:
            for sequence in lane.slots:
                if sequence is None or sequence.queue or sequence.running:
                    continue
                expires = sequence.last_ns + self._idle_ns
                if now >= expires:
                    log.info("sequence %s of model '%s' idle for longer than max_sequence_idle_microseconds: "
                             "releasing its slot", sequence.corrid, self._model)
                    self._release(sequence)
                elif not nearest or expires < nearest:
                    nearest = expires
        if nearest or self._sequences or self._backlog:
            wait = (nearest - now) / 1e9 if nearest else self._idle_ns / 1e9
            assert self._loop is not None
            self._reaper = self._loop.call_later(max(wait, 0.001), self._reap)

    # --- batch formation ----------------------------------------------------------------------------------------

    def _run(self, lane: Lane) -> None:
        lane.soon = False
        if lane.busy:
            return
        for sequence in list(lane.slots):
            if sequence is not None and sequence.queue and sequence.queue[0][0].cancelled:
                self._cancel(sequence)
        ready = [s for s in lane.slots if s is not None and s.queue]
        if not ready:
            return
        if self._delay_ns and self._should_wait(lane, ready):
            return
        if self._limiter is not None and not self._limiter.acquire(lane.instance, lambda: self._wake(lane)):
            return
        if self._oldest:
            batch, owners = self._oldest_batch(ready)
        else:
            batch, owners = self._direct_batch(lane)
        lane.busy = True
        started = now_ns()
        run(lane.instance, batch, lambda i, reqs, result: self._finish(lane, reqs, owners, result, started))

    def _should_wait(self, lane: Lane, ready: list[Sequence]) -> bool:
        oldest = min(s.queue[0][0].arrival_ns for s in ready)
        waited = now_ns() - oldest
        if waited >= self._delay_ns:
            return False
        if self._oldest:
            full = len(ready) >= (max(self._preferred) if self._preferred else self._max_batch)
        else:
            full = self._utilization == 0.0 or len(ready) / self._max_batch >= self._utilization
        if full:
            return False
        if lane.timer is None:
            assert self._loop is not None

            def fire() -> None:
                lane.timer = None
                self._run_after_delay(lane)

            lane.timer = self._loop.call_later((self._delay_ns - waited) / 1e9, fire)
        return True

    def _run_after_delay(self, lane: Lane) -> None:
        saved, self._delay_ns = self._delay_ns, 0
        try:
            self._run(lane)
        finally:
            self._delay_ns = saved

    def _direct_batch(self, lane: Lane) -> tuple[list[InferRequest], list[Sequence | None]]:
        slots = lane.slots
        top = max(i for i, s in enumerate(slots) if s is not None and s.queue)
        batch: list[InferRequest] = []
        owners: list[Sequence | None] = []
        template: InferRequest | None = None
        first_key = None
        for index in range(top + 1):
            sequence = slots[index]
            request = sequence.queue[0][0] if sequence is not None and sequence.queue else None
            if request is not None and self._key.active:
                key = self._key(request)
                if first_key is None:
                    first_key = key
                elif key != first_key:
                    request = None  # can't share this batch: it waits for the next one
            if request is None:
                batch.append(None)  # type: ignore[arg-type]  # padding, filled below
                owners.append(None)
                continue
            assert sequence is not None
            self._take(sequence)
            template = template or request
            batch.append(request)
            owners.append(sequence)
        assert template is not None
        for index, request in enumerate(batch):
            if request is None:
                batch[index] = self._padding(template)
        return batch, owners

    def _oldest_batch(self, ready: list[Sequence]) -> tuple[list[InferRequest], list[Sequence | None]]:
        ready.sort(key=lambda s: s.queue[0][0].arrival_ns)
        chosen: list[Sequence] = []
        first_key = None
        best = 0
        for sequence in ready:
            if len(chosen) == self._max_batch:
                break
            request = sequence.queue[0][0]
            if self._key.active:
                key = self._key(request)
                if first_key is None:
                    first_key = key
                elif key != first_key:
                    continue
            chosen.append(sequence)
            if len(chosen) in self._preferred:
                best = len(chosen)
        if best and self._delay_ns:
            chosen = chosen[:best]
        batch = []
        for sequence in chosen:
            batch.append(sequence.queue[0][0])
            self._take(sequence)
        return batch, list(chosen)

    def _take(self, sequence: Sequence) -> None:
        """Pop a sequence's next request and give it the control and state inputs the model expects."""
        request, _ = sequence.queue[0]
        spec = self._spec
        inputs = request.inputs
        start = bool(request.flags & START)
        end = bool(request.flags & END)
        if spec.start is not None:
            inputs[spec.start.name] = spec.start.true if start else spec.start.false
        if spec.end is not None:
            inputs[spec.end.name] = spec.end.true if end else spec.end.false
        if spec.ready is not None:
            inputs[spec.ready.name] = spec.ready.true
        if spec.corrid_name:
            inputs[spec.corrid_name] = spec.corrid(sequence.corrid)
        for state in spec.states:
            if start or state.input_name not in sequence.state:
                sequence.state[state.input_name] = state.initial.copy()
            inputs[state.input_name] = sequence.state[state.input_name]
        sequence.running += 1
        self._queued -= 1

    def _padding(self, template: InferRequest) -> InferRequest:
        """A not-READY request that keeps the other sequences in their rows (Triton's null request)."""
        spec = self._spec
        pad = InferRequest(template.model_name, template.model_version)
        pad.inputs = {name: np.zeros_like(array) for name, array in template.inputs.items()}
        for control in (spec.start, spec.end, spec.ready):
            if control is not None:
                pad.inputs[control.name] = control.false
        if spec.corrid_name:
            pad.inputs[spec.corrid_name] = spec.corrid(0)
        pad.batch_size = template.batch_size
        pad.arrival_ns = now_ns()
        return pad

    # --- completion ---------------------------------------------------------------------------------------------

    def _finish(self, lane: Lane, batch: list[InferRequest], owners: list[Sequence | None], result: Execution,
                started: int) -> None:
        lane.busy = False
        if self._limiter is not None:
            self._limiter.release(lane.instance)
        real = [r for r, o in zip(batch, owners) if o is not None]
        record(self._stats, real, result, started, batch_size=len(batch))
        states = self._spec.states
        again = set(result.rescheduled) if result.rescheduled and self._iterative else ()
        for index, (request, sequence, response) in enumerate(zip(batch, owners, result.responses)):
            if sequence is None:
                continue  # padding: nobody waits for its response
            sequence.running -= 1
            if states and response.error is None and not result.failed:
                outputs = response.outputs
                for state in states:
                    value = outputs.get(state.output_name)
                    if value is not None:
                        sequence.state[state.input_name] = value
                        if state.output_name not in self._declared_outputs:
                            del outputs[state.output_name]
            if index in again:
                continue  # its sequence goes on
            if request.flags & END and sequence.lane is lane:
                self._release(sequence)
            elif self._iterative and len(sequence.queue) == 1 and sequence.lane is lane:
                self._release(sequence)  # released for good: its sequence ends (Triton enqueues a null END)
        for index, (request, sequence, response) in enumerate(zip(batch, owners, result.responses)):
            if sequence is None:
                continue
            entry = sequence.queue.popleft()
            if index in again:  # back to its sequence's queue, neither START nor END now
                request.flags = 0
                sequence.queue.append(entry)
                self._queued += 1
                sequence.last_ns = now_ns()
                if sequence.lane is None and sequence not in self._backlog:
                    self._backlog.append(sequence)
                continue
            entry[1](request, response, result.failed)
        # The next batch on the next loop turn: an inline model must not recurse once per batch.
        self._wake(lane)
