"""A memory-bounded model cache: models loaded from repositories registered at run time, unloaded in the order an
eviction policy gives (eviction.py: GDSF by default, or LRU) before a load that would not fit the memory limit.
SageMaker's multi-model residency (``naiad.sagemaker.residency``) is one: it says which repository a url names
and fetches archives on a miss.

Loads run side by side, up to --model-load-thread-count, each holding the memory it is expected to take while it
loads; evictions run one at a time (memory accounting needs a settled picture); cache hits never wait. Concurrent
misses on one model share one load; a step that runs off the event loop (a download, an extraction) gives up at
--model-load-timeout-secs, which fails only the requests waiting for that model.

GPUs count too (``naiad.repository.devices``): before a model loads, models on the devices it will use are unloaded
until its device memory fits under the device's capacity (its --model-load-gpu-limit share, else all of it),
judged on the device's used memory as the driver reports it. A model's need there is what it held when it was
last loaded, else the size of its files. A load or an execution that fails out of memory (CUDA's, onnxruntime's,
TensorRT's words) or over the GPU limit while other models are resident unloads the least valuable of them, in the
eviction policy's order, and runs once more.

A model another party loaded and owns the residency of (``pinned``: SageMaker's agent through ``POST /models``, which
unloads and retries on a 507; Ray's multiplexer) is never unloaded here, and its load unloads nothing: a load that
does not fit is refused, and what is resident stays. Models loaded on demand are the cache's own: a load unloads
some only when it can then fit (its size as measured at its last load, else its files', counted beside what the
pinned models hold); one that cannot is refused first, before anything is evicted.

Repositories come and go through the repository's own ``register`` / ``unregister``; models through model control.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, TypeVar

from naiad.config.loader import load_config
from naiad.config.scheduling import fill_instance_groups, gpu_instances
from naiad.core.cache_stats import CacheStats
from naiad.core.devices import devices, out_of_memory
from naiad.core.errors import Code, InferError, not_found
from naiad.repository.control import ModelControl
from naiad.repository.devices import capacity, held_by, processes, used_memory
from naiad.repository.eviction import DEFAULT_POLICY, EvictionPolicy, make_policy
from naiad.repository.layout import model_dirs
from naiad.repository.manager import ModelRepository
from naiad.repository.memory import format_size, own_rss, processes_memory

log = logging.getLogger("naiad.residency")

T = TypeVar("T")


@dataclass
class Resident:
    key: str  # what the model is filed under (SageMaker: its model_name, a hash of the target model)
    url: str  # the repository registered for it (SageMaker reports it as modelUrl)
    repository: Path
    target: str  # the name the model is served under
    folder: Path | None = None  # what an on-demand load extracted, removed once the model is unloaded
    names: list[str] = field(default_factory=list)  # every model loaded from the repository (ensembles: several)
    memory: int = 0
    in_process: int = 0  # the server's own growth while the model loaded
    last_used: float = 0.0
    gpus: frozenset[int] = frozenset()  # the GPUs its instances run on
    device: dict[int, int] = field(default_factory=dict)  # GPU -> bytes it holds there
    pinned: bool = False  # its loader owns its residency: never unloaded but by an unload call


class StepFailed(InferError):
    """A step of an on-demand load that ran off the event loop failed or gave up (``ModelCache._off_loop``)."""


class ModelCache:
    kind = "model"  # what the log calls a cached model
    step_error: type[InferError] = StepFailed  # what a failed or abandoned off-loop step raises

    def __init__(self, repository: ModelRepository, control: ModelControl, memory_limit: int | None = None,
                 policy: EvictionPolicy | None = None, stats: CacheStats | None = None) -> None:
        self.repository = repository
        self.control = control
        self.memory_limit = memory_limit
        self.models: dict[str, Resident] = {}  # by key, in load order
        self._by_name: dict[str, Resident] = {}
        self._pending: dict[str, asyncio.Future] = {}  # on-demand loads in progress, by target model
        self._waiting: dict[str, int] = {}  # target -> requests waiting for its load (it is not evicted meanwhile)
        self._slots = asyncio.Semaphore(max(1, repository.options.load_threads))  # loads side by side
        self._loading: set[str] = set()  # keys whose load is in progress
        self._room = asyncio.Condition()  # held for memory decisions: evictions and reservations
        self._reserved: dict[str, int] = {}  # key -> memory expected, while its load runs
        self._leaving: dict[str, tuple[asyncio.Event, int]] = {}  # key -> (set when gone, memory it held)
        self._known: dict[str, int] = {}  # target -> memory measured when it was last loaded
        self._overheads: list[int] = []  # memory beyond the files on disk, per model measured so far
        self._reserved_device: dict[str, dict[int, int]] = {}  # key -> GPU -> bytes expected, while it loads
        self._known_device: dict[str, tuple[frozenset[int], dict[int, int]]] = {}  # target -> GPUs and bytes there
        self._freeing: asyncio.Future | None = None  # an unload after an out-of-memory failure, in progress
        # key -> its requests waiting for _free before running again: never a victim, since unloading it would
        # wait for those very requests.
        self._retrying: dict[str, int] = {}
        self.stats = stats if stats is not None else CacheStats()
        self.policy = policy or make_policy(DEFAULT_POLICY)
        self._counted = ""  # the target hit() just counted: the same request's touch() is not a second use

    def get(self, key: str) -> Resident | None:
        return self.models.get(key)

    def listed(self) -> list[Resident]:
        return [r for r in self.models.values() if self.repository.is_ready(r.target)]

    # --- loading -----------------------------------------------------------------------------------------------

    async def _admit(self, key: str, repository: Path, model_folder: str, target: str, folder: Path | None,
                     fetched: float = 0.0, pinned: bool = False) -> Resident:
        """Register ``repository`` with ``model_folder`` served as ``target``, making room first (unless
        ``pinned``: then nothing is unloaded for it), and load it (the caller holds a load slot). ``fetched``:
        seconds spent getting its files, part of a miss's cost."""
        if key in self.models or key in self._loading:
            raise InferError(f"model repository '{repository}' has already been registered", Code.ALREADY_EXISTS)
        disk = _disk_size(repository / model_folder) if model_folder else 0
        self.check_fits(target, self._known.get(target, disk), pinned)
        gpus, device_need = self._device_need(target, repository / model_folder, disk)
        self._loading.add(key)
        try:
            async with self._room:
                if not pinned:
                    await self._make_room(self._known.get(target, disk + self._overhead()), keep=key)
                    await self._make_device_room(device_need, keep=key)
                self._reserved[key] = self._known.get(target, disk + self._overhead())
                self._reserved_device[key] = device_need
            started = time.perf_counter()
            for attempt in range(2):
                self._check_names(repository, model_folder)  # with no wait before the register: a settled picture
                self.repository.register(repository, {model_folder: target})
                before, device_before = own_rss(), used_memory(gpus)
                try:
                    await self.control.load_model(target)
                    break
                except InferError as exc:
                    await self._discard(repository, [target])
                    if (attempt or pinned or not _short_of_memory(exc.message)
                            or not await self._free(key, gpus)):
                        raise
                    log.warning("loading %s '%s' ran out of memory; loading it again after an unload", self.kind,
                                target)
                except BaseException:
                    await self._discard(repository, [target])
                    raise
            loading = time.perf_counter() - started
            self.stats.loading.add(loading)
            # The server's own growth, shared among the loads that ran beside this one.
            grown = max(0, own_rss() - before) // max(1, len(self._loading))
            resident = Resident(key, str(repository), repository, target, folder, in_process=grown,
                                last_used=time.monotonic(), pinned=pinned)
            resident.names = self.repository.served_from(repository) or [target]
            resident.memory = self._measure(resident)
            self._measure_device(resident, device_before)
        finally:
            self._loading.discard(key)
            self._reserved.pop(key, None)
            self._reserved_device.pop(key, None)
            self._changed()
        self._known_device[target] = (resident.gpus, dict(resident.device))
        self._known[target] = resident.memory
        self._overheads.append(max(0, resident.memory - disk))
        beside = self._committed() if pinned else self._pinned()  # what may not be unloaded for it
        if self.memory_limit is not None and beside + resident.memory > self.memory_limit:
            await self._unload(resident)
            raise InferError(self._too_big(target, resident.memory, beside), Code.INVALID_ARG)
        self.models[key] = resident
        self._by_name[target] = resident
        self._retries(resident)
        self.policy.admit(target, fetched + loading)  # what a miss on it costs: download, extraction, load
        log.info("loaded %s '%s' (key %s): %s%s", self.kind, target, key, format_size(resident.memory),
                 f", {format_size(self.used())} of {format_size(self.memory_limit)} in use"
                 if self.memory_limit is not None else "")
        if not pinned:
            async with self._room:
                await self._make_room(0, keep=key)
        return resident

    def check_fits(self, target: str, need: int, pinned: bool = False) -> None:
        """Refuse (Out of memory) a load of ``target`` whose ``need`` (bytes it takes at least: measured at its
        last load, its files) cannot fit under the limit: beside everything resident for a ``pinned`` load, which
        unloads nothing; beside the pinned models for the cache's own, which unload only the others."""
        if self.memory_limit is None:
            return
        need = max(need, self._known.get(target, 0))
        beside = self._committed() if pinned else self._pinned()
        if beside + need > self.memory_limit:
            raise InferError(self._too_big(target, need, beside), Code.INVALID_ARG)

    def _pinned(self) -> int:
        """What the pinned models hold: the floor no eviction goes below."""
        return sum(r.memory for r in self.models.values() if r.pinned)

    def _check_names(self, repository: Path, model_folder: str) -> None:
        """The repository's other models (an ensemble's composing models) are served under their folder names:
        one that another loaded repository serves already is refused, not silently shared (naiad has no model
        namespacing; Triton's register refuses a conflicting mapping in the same words)."""
        taken = set(self.repository.scan())
        for name in sorted(set(model_dirs(repository)) - {model_folder}):
            if name in taken:
                raise InferError(f"failed to register '{repository}', there is a conflicting mapping for '{name}' "
                                 "(a model already loaded from another repository has that name)",
                                 Code.ALREADY_EXISTS)

    async def unload(self, key: str) -> None:
        """Unload the model and its dependents and unregister its repository; returns once its worker
        processes are gone (the memory is released). A load of ``key`` in progress is waited for."""
        while key in self._loading:
            async with self._room:
                await self._room.wait()
        resident = self.models.get(key)
        if resident is None:
            raise not_found(f"model '{key}' is not loaded")
        await self._unload(resident)

    def touch(self, name: str) -> bool:
        """An invocation of ``name``: mark it used now. False when no resident model has that name."""
        resident = self._by_name.get(name)
        if resident is None:
            return False
        resident.last_used = time.monotonic()
        counted, self._counted = self._counted, ""
        if name != counted:
            self.policy.access(name)
        return True

    # --- on-demand loading -------------------------------------------------------------------------------------

    def hit(self, target: str) -> bool:
        """A cache hit: ``target`` is loaded and ready; it is marked used now and counted."""
        if self.touch(target) and self.repository.is_ready(target):
            self.stats.cache_hits += 1
            self._counted = target  # the request's touch() when it is submitted follows at once
            return True
        return False

    async def ensure(self, target: str) -> None:
        """Make ``target`` served: a hit touches it, a miss loads it (``_miss``). Concurrent misses on one target
        wait on the same load, which runs as its own task: a caller that goes away stops waiting, not the load
        the others wait for. The caller must submit its request before it next yields (a model just loaded is
        kept only until then)."""
        if self.hit(target):
            return
        self.stats.cache_misses += 1
        started = time.perf_counter()
        self._waiting[target] = self._waiting.get(target, 0) + 1
        try:
            pending = self._pending.get(target)
            if pending is None:
                pending = self._pending[target] = asyncio.ensure_future(self._miss(target))
                pending.add_done_callback(partial(self._load_done, target))
            await asyncio.shield(pending)
        finally:
            # The caller submits its request before it next yields: from then on the model is busy, not new.
            self._waiting[target] -= 1
            if not self._waiting[target]:
                del self._waiting[target]
                self._changed()
            self.stats.loading_wait.add(time.perf_counter() - started)

    async def _miss(self, target: str) -> None:
        """Load ``target``, which is not loaded: a cache that fetches models on demand says how."""
        raise not_found(f"model '{target}' is not loaded")

    def _load_done(self, target: str, task: asyncio.Future) -> None:
        if self._pending.get(target) is task:
            del self._pending[target]
        if not task.cancelled():
            task.exception()  # its waiters got it; nobody else has to

    async def _off_loop(self, what: str, call: Callable[[], int | None], cleanup: Callable[[], None],
                        key: str = "") -> int | None:
        """``call`` on a thread, given up at --model-load-timeout-secs: its requests fail, and ``cleanup`` runs
        once the thread is done after all (until then, ``key`` counts as leaving: a new load of it waits)."""
        future = _on_thread(call)
        timeout = self.repository.options.load_timeout
        try:
            return await (asyncio.wait_for(asyncio.shield(future), timeout) if timeout else future)
        except InferError as exc:
            raise self.step_error(exc.message, exc.code) from None
        except asyncio.TimeoutError:
            gone = asyncio.Event()
            if key:
                self._leaving[key] = (gone, 0)

            def late(done: asyncio.Future) -> None:
                if not done.cancelled():
                    done.exception()  # retrieved: nobody waits for it any more
                cleanup()
                if key and self._leaving.get(key, (None,))[0] is gone:
                    del self._leaving[key]
                gone.set()

            future.add_done_callback(late)
            log.error("%s did not finish within %g s (--model-load-timeout-secs); giving it up", what, timeout)
            raise self.step_error(f"{what} did not finish within {timeout:g} s (--model-load-timeout-secs)",
                                   Code.UNAVAILABLE) from None

    # --- memory ------------------------------------------------------------------------------------------------

    def used(self) -> int:
        return sum(r.memory for r in self.models.values())

    def _committed(self) -> int:
        """Loaded models, loads in progress and unloads not finished yet."""
        return self.used() + sum(self._reserved.values()) + sum(m for _, m in self._leaving.values())

    def _changed(self) -> None:
        """A load or unload finished: loads waiting for room look again."""
        async def notify() -> None:
            async with self._room:
                self._room.notify_all()

        asyncio.ensure_future(notify())

    def refresh(self) -> None:
        """Measure every loaded model again (workers grow, restart, share pages)."""
        on_gpus = frozenset().union(*(r.gpus for r in self.models.values()))
        snapshot = processes(on_gpus) if on_gpus else {}  # one read per device, whatever the models
        for resident in self.models.values():
            resident.memory = self._measure(resident)
            if resident.gpus:
                self._measure_device(resident, snapshot=snapshot)

    def _measure(self, resident: Resident) -> int:
        pids = [pid for name in resident.names for pid in self._pids(name)]
        return processes_memory(pids) + resident.in_process

    def _pids(self, name: str) -> list[int]:
        entry = self.repository.models.get(name)
        if entry is None:
            return []
        return [pid for model in entry.versions.values() for pid in model.loaded.pids()]

    # --- device memory -----------------------------------------------------------------------------------------

    def _device_need(self, target: str, folder: Path, disk: int) -> tuple[frozenset[int], dict[int, int]]:
        """The GPUs ``target`` will run on and what it is expected to hold on each: as measured at its last load,
        else its files' size (the weights a GPU model copies there)."""
        known = self._known_device.get(target)
        if known is not None:
            return known[0], dict(known[1])
        if devices() is None:
            return frozenset(), {}
        try:
            config, _ = load_config(folder, self.repository.options.config_name)
            config.name = config.name or target
            fill_instance_groups(config)
        except InferError:
            return frozenset(), {}  # its load says what is wrong
        gpus = frozenset(gpu_instances(config))
        return gpus, {gpu: disk for gpu in gpus}

    def _measure_device(self, resident: Resident, before: dict[int, int] | None = None,
                        snapshot: dict[int, dict[int, int] | None] | None = None) -> None:
        """What ``resident`` holds on its GPUs: its processes' memory there where the driver reports it, else
        (just loaded: ``before`` is each device's use before the load) the devices' growth during its load."""
        if not resident.gpus:
            entry = self.repository.models.get(resident.target)
            model = entry.latest() if entry is not None else None
            resident.gpus = frozenset(gpu_instances(model.config)) if model is not None else frozenset()
        if not resident.gpus:
            return
        pids = [pid for name in resident.names for pid in self._pids(name)]
        held = held_by(pids, resident.gpus, snapshot)
        if held is not None:
            resident.device = held
        elif before is not None:
            after = used_memory(resident.gpus)
            beside = max(1, len(self._loading))
            resident.device = {gpu: max(0, after[gpu] - before.get(gpu, after[gpu])) // beside for gpu in after}

    async def _make_device_room(self, need: dict[int, int], keep: str) -> None:
        """Unload models on each GPU in ``need`` until its bytes fit under the device's capacity (called with
        ``_room`` held). Loads in progress count with what they are expected to take; with nothing left to unload
        there, the load goes ahead and the device (its limit, or an allocation failure) decides."""
        source = devices()
        if source is None or not need:
            return
        limits = self.repository.options.gpu_limits
        count = source.count()
        for gpu, size in sorted(need.items()):
            if gpu >= count:
                continue
            while True:
                loading = sum(r.get(gpu, 0) for k, r in self._reserved_device.items() if k != keep)
                used = source.memory(gpu)[0] + loading
                room = capacity(source, gpu, limits)
                if used + size <= room:
                    break
                victims = [r for r in self.models.values() if r.key != keep and gpu in r.gpus and not r.pinned
                           and r.target not in self._waiting and r.key not in self._retrying]
                if used - sum(r.device.get(gpu, 0) for r in victims) + size > room and not loading:
                    return  # unloading them all would not make room: the device decides, and nothing is lost
                if not victims:
                    if loading or any(m for _, m in self._leaving.values()):
                        await self._room.wait()  # a load or an unload in progress changes the picture
                        continue
                    return
                victim = min(victims, key=lambda r: (self._busy(r), self.policy.priority(r.target,
                                                                                         r.device.get(gpu, 0))))
                log.info("evicting '%s' (%s on GPU %d, %s) to fit %s there under %s", victim.target,
                         format_size(victim.device.get(gpu, 0)), gpu, self.policy.describes, format_size(size),
                         format_size(room))
                await self._evict(victim)

    async def _evict(self, victim: Resident) -> None:
        await self._unload(victim)
        self.stats.evictions += 1
        self.stats.last_evicted = [*self.stats.last_evicted[-19:], (time.time(), victim.target)]

    async def _free(self, keep: str, gpus: frozenset[int]) -> bool:
        """After an out-of-memory failure of ``keep``'s model: unload the least valuable other resident model, one
        on the same GPUs where it has any; True once one is gone. Failures at the same moment share one unload."""
        if self._freeing is not None:
            return bool(await asyncio.shield(self._freeing))
        self._freeing = asyncio.get_running_loop().create_future()
        freed = False
        try:
            async with self._room:
                victims = [r for r in self.models.values() if r.key != keep and r.target not in self._waiting
                           and not r.pinned and r.key not in self._retrying and (not gpus or r.gpus & gpus)]
                if victims:
                    victim = min(victims, key=lambda r: (self._busy(r), self.policy.priority(r.target, r.memory)))
                    log.info("evicting '%s' (%s) after an out-of-memory failure", victim.target,
                             self.policy.describes)
                    await self._evict(victim)
                    freed = True
        finally:
            self._freeing.set_result(freed)
            self._freeing = None
        return freed

    def _retries(self, resident: Resident) -> None:
        """Executions of ``resident``'s models that fail out of memory free memory (``_free``) and run again."""
        free = partial(self._free_for, resident)
        for name in resident.names:
            entry = self.repository.models.get(name)
            for model in entry.versions.values() if entry is not None else ():
                model.free_memory = free

    async def _free_for(self, resident: Resident) -> bool:
        key = resident.key
        if key not in self.models:  # being unloaded itself (perhaps to make room for another)
            return False
        self._retrying[key] = self._retrying.get(key, 0) + 1
        try:
            return await self._free(key, resident.gpus)
        finally:
            self._retrying[key] -= 1
            if not self._retrying[key]:
                del self._retrying[key]

    def _overhead(self) -> int:
        """What a model took beyond its files so far (interpreter, libraries): the guess for an unknown one."""
        return int(sum(self._overheads) / len(self._overheads)) if self._overheads else 0

    def _too_big(self, target: str, need: int, beside: int = 0) -> str:
        # Worded as an allocation failure is ("Out of memory"): SageMaker answers both 507 (naiad.sagemaker.contract).
        limit = f"the memory limit of {format_size(self.memory_limit or 0)} (--model-memory-limit)"
        if not beside:
            return f"Out of memory: model '{target}' needs {format_size(need)}, more than {limit}"
        return (f"Out of memory: model '{target}' needs {format_size(need)}, and {format_size(beside)} of {limit} "
                "is held by models this load may not unload (nothing was unloaded for it)")

    async def _make_room(self, need: int, keep: str) -> None:
        """Unload models in the eviction policy's order until ``need`` more bytes fit under the limit. A model
        that is busy goes after the idle ones; its requests finish before it is finalized either way. With nothing
        left to unload, a load waits for the loads and unloads in progress (called with ``_room`` held). Nothing
        is unloaded when unloading all it may would not make room: the load goes ahead, and its measure decides."""
        if self.memory_limit is None:
            return
        self.refresh()
        if self._pinned() + need > self.memory_limit:
            return
        while self._committed() + need > self.memory_limit:
            victims = [r for r in self.models.values() if r.key != keep and r.key not in self._retrying
                       and not r.pinned]
            held = [r for r in victims if r.target in self._waiting]  # just loaded: its requests go first
            victims = [r for r in victims if r.target not in self._waiting]
            if not victims:
                # Loads holding memory, unloads about to release some, or requests about to run on a model just
                # loaded will change the picture.
                if need and (held or set(self._reserved) - {keep} or any(m for _, m in self._leaving.values())):
                    await self._room.wait()
                    self.refresh()
                    continue
                return
            victim = min(victims, key=lambda r: (self._busy(r), self.policy.priority(r.target, r.memory)))
            log.info("evicting '%s' (%s, %s) to fit %s under the limit of %s", victim.target,
                     format_size(victim.memory), self.policy.describes, format_size(need),
                     format_size(self.memory_limit))
            await self._evict(victim)

    def _busy(self, resident: Resident) -> bool:
        return any(m.in_flight for name in resident.names
                   for m in (self.repository.models[name].versions.values() if name in self.repository.models else ()))

    # --- unloading ---------------------------------------------------------------------------------------------

    async def _unload(self, resident: Resident) -> None:
        started = time.perf_counter()
        self._by_name.pop(resident.target, None)
        self.models.pop(resident.key, None)
        self.policy.removed(resident.target)
        gone = asyncio.Event()
        self._leaving[resident.key] = (gone, resident.memory)  # until its workers are gone
        try:
            await self._discard(resident.repository, resident.names)
            if resident.folder is not None:
                shutil.rmtree(resident.folder, ignore_errors=True)
        finally:
            if self._leaving.get(resident.key, (None,))[0] is gone:
                del self._leaving[resident.key]
            gone.set()
            self._changed()
        self.stats.unloading.add(time.perf_counter() - started)
        log.info("unloaded %s '%s' (key %s)", self.kind, resident.target, resident.key)

    async def _discard(self, repository: Path, names: list[str]) -> None:
        """Unload ``names`` (and their dependents), wait for their finalize(), unregister the repository."""
        for name in names:
            await self.control.unload_model(name, unload_dependents=True)
        await self.control.settle()
        self.repository.unregister(repository, missing_ok=True)


def _short_of_memory(message: str) -> bool:
    """A load that failed for want of device memory: an allocation failure, or over --model-load-gpu-limit."""
    return out_of_memory(message) or "has exceeded, model loading is rejected" in message


def _on_thread(call: Callable[[], T]) -> asyncio.Future[T]:
    """``call`` on a daemon thread of its own: a download that hangs past its timeout must not hold up the
    server's exit, as a thread of an executor would (the interpreter joins those)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            outcome: tuple[T | None, BaseException | None] = (call(), None)
        except BaseException as exc:  # handed to the loop, which raises it in the caller
            outcome = (None, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop closed meanwhile: the server is exiting
            pass

    threading.Thread(target=run, name="naiad-fetch", daemon=True).start()
    return future


def _disk_size(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total
