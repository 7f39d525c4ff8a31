"""Loads every model of the repositories and answers which version serves a request.

A model that fails to load is recorded with its reason and never stops the others.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from naiad.backends.base import Core, VersionContext
from naiad.backends.registry import get_backend, python_based, set_backend_directory
from naiad.config import ModelConfig
from naiad.config.ensemble import ENSEMBLE_PLATFORM, dependencies, validate_mapping, validate_scheduling
from naiad.config.loader import load_config
from naiad.config.normalize import detect_backend, fill_defaults
from naiad.config.render import config_to_dict
from naiad.config.validate import validate, validate_identity
from naiad.core.errors import STATUS_NAMES, Code, InferError, internal, invalid, not_found, unavailable
from naiad.repository.consent import check_model_file
from naiad.repository.devices import check_gpu_limit
from naiad.repository.events import LOAD, UNLOAD, Entries, Events
from naiad.repository.layout import model_dirs, select_versions, version_dirs
from naiad.repository.model import ModelVersion
from naiad.repository.warmup import warm_up
from naiad.scheduling.cache import ResponseCache
from naiad.scheduling.ensemble import EnsembleVersion
from naiad.scheduling.rate_limiter import RateLimiter

log = logging.getLogger("naiad.repository")

# How long past --model-load-timeout-secs a load that can't be interrupted (a backend's C++ session, an in-process
# initialize()) is waited for before its model is failed without it; Python workers are killed at the timeout itself.
LOAD_TIMEOUT_GRACE = 2.0


def _is_ensemble(path: Path, config_name: str) -> bool:
    try:
        config, _ = load_config(path, config_name)
    except InferError:
        return False  # the normal load reports the broken config
    return config.platform == ENSEMBLE_PLATFORM or config.HasField("ensemble_scheduling")


@dataclass
class ModelEntry:
    name: str
    path: Path
    config: ModelConfig | None = None
    config_dict: dict[str, Any] | None = None
    # Changed only through add_version, remove_version and clear_versions, which keep ``newest`` with it.
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)  # version -> reason
    reason: str = ""  # the whole model failed before any version was tried
    polled: bool = False  # its config was read and names it: Triton knows the model, ready or not
    unloaded: set[int] = field(default_factory=set)  # versions unloaded by model control (index: "unloaded")
    unloading: set[int] = field(default_factory=set)  # versions draining in-flight requests before finalize()
    scratch: Path | None = None  # the folder a load's ``file:`` overrides were written to; removed on unload
    fingerprint: tuple | None = None  # model control: the files it was loaded from (None: a config override)
    # Loaded on request (or with the repository); False: only because a loaded ensemble is made of it, so an
    # unload with unload_dependents takes it along once no loaded model uses it (Triton's explicitly_load_).
    explicit: bool = True
    # The version that serves a request naming none, kept as versions change: found with no search per request.
    newest: ModelVersion | None = field(default=None, init=False, repr=False)
    # The repository's, once the entry is in it: told of each version loaded and unloaded.
    events: Events | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._versions_changed()

    @property
    def ready(self) -> bool:
        return bool(self.versions)

    def latest(self) -> ModelVersion | None:
        return self.newest

    def add_version(self, version: int, model: ModelVersion) -> None:
        self.versions[version] = model
        self._versions_changed()
        if self.events is not None:
            self.events.emit(LOAD, self.name)

    def remove_version(self, version: int) -> None:
        del self.versions[version]
        self._versions_changed()
        if self.events is not None:
            self.events.emit(UNLOAD, self.name)

    def clear_versions(self) -> None:
        had = bool(self.versions)
        self.versions.clear()
        self.newest = None
        if had and self.events is not None:
            self.events.emit(UNLOAD, self.name)

    def _versions_changed(self) -> None:
        self.newest = self.versions[max(self.versions)] if self.versions else None


@dataclass
class RepositoryOptions:
    paths: list[Path]
    config_name: str = ""
    auto_complete: bool = True
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    backend_directory: str = "/opt/tritonserver/backends"  # --backend-directory: Python-based backends
    response_cache: ResponseCache | None = None  # --cache-config: shared by every model that enables it
    rate_limiter: RateLimiter | None = None  # --rate-limit execution_count
    load_threads: int = 4  # --model-load-thread-count: loads run side by side (start-up and model control)
    # --model-load-timeout-secs: a model whose load takes longer fails (0: wait forever, as Triton does). Ten
    # minutes: longer than a model that fits one host takes to read from local disk, short enough that a hung
    # initialize() is reported rather than leaving the model LOADING (and a load thread taken) for good.
    load_timeout: float = 600.0
    load_retries: int = 0  # --model-load-retry-count: further attempts after a version fails to load
    gpu_limits: dict[int, float] = field(default_factory=dict)  # --model-load-gpu-limit: device -> fraction


class ModelRepository:
    def __init__(self, options: RepositoryOptions) -> None:
        set_backend_directory(options.backend_directory)
        self.options = options
        self.events = Events()  # loads, unloads and changes, as they happen
        self.models: dict[str, ModelEntry] = Entries(self.events)
        self._load_pool: ThreadPoolExecutor | None = None  # --model-load-thread-count: every load
        self.core: Core | None = None  # the service, which sets itself here: models that call models reach it
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's loop, once loading starts on it
        self.loading: dict[str, set[int]] = {}  # model control: versions being loaded right now
        # Repositories added at run time (SageMaker's multi-model loads), each with the names its model
        # folders are served under: folder -> model name (unmapped folders keep their own name).
        self.registered: dict[Path, dict[str, str]] = {}

    def scan(self) -> dict[str, list[Path]]:
        """Every model folder of every repository, by name (a name in two repositories is ambiguous)."""
        found: dict[str, list[Path]] = {}
        for repo in self.options.paths:
            for name, path in model_dirs(repo).items():
                found.setdefault(name, []).append(path)
        for repo, mapping in list(self.registered.items()):
            for folder, path in model_dirs(repo).items():
                found.setdefault(mapping.get(folder, folder), []).append(path)
        return found

    def register(self, repository: Path, mapping: dict[str, str]) -> None:
        """Add a repository whose folders are served under ``mapping``'s names (Triton's
        RegisterModelRepository). A repository registered twice, or a name some other model folder already
        has, is ALREADY_EXISTS."""
        if repository in self.registered:
            raise InferError(f"model repository '{repository}' has already been registered", Code.ALREADY_EXISTS)
        taken = self.scan()
        for folder, name in mapping.items():
            if name in taken:
                raise InferError(f"failed to register '{repository}', there is a conflicting mapping for '{name}'",
                                 Code.ALREADY_EXISTS)
        self.registered[repository] = dict(mapping)

    def unregister(self, repository: Path, missing_ok: bool = False) -> None:
        """Forget a repository ``register`` added, and its models that hold no loaded version (a loaded one
        stays, served under its name, until it is unloaded)."""
        if self.registered.pop(repository, None) is None and not missing_ok:
            raise invalid(f"failed to unregister '{repository}', repository not found")
        for name, entry in list(self.models.items()):
            if entry.path.parent == repository and not entry.versions:
                del self.models[name]

    def served_from(self, repository: Path) -> list[str]:
        """The models with a loaded version whose folders are in ``repository``."""
        return [name for name, entry in self.models.items() if entry.versions and entry.path.parent == repository]

    def load_all(self, only: set[str] | None = None) -> None:
        """Load every model (or those named in ``only``: explicit mode's ``--load-model``)."""
        try:
            self.loop = asyncio.get_running_loop()
        except RuntimeError:  # loaded outside a server (tools, unit tests)
            pass
        ensembles: dict[str, Path] = {}
        plain: dict[str, Path] = {}
        found = self.scan()
        if only is not None:
            found = {n: p for n, p in found.items() if n in only}
            for name in sorted(only - set(found)):
                log.error("failed to load '%s': failed to poll from model repository", name)
        for name, paths in found.items():
            if len(paths) > 1:
                entry = ModelEntry(name, paths[0])
                entry.reason = f"model '{name}' appears in multiple repositories: " + ", ".join(map(str, paths))
                self.models[name] = entry
                log.error("failed to load '%s': %s", name, entry.reason)
                continue
            if _is_ensemble(paths[0], self.options.config_name):
                ensembles[name] = paths[0]
            else:
                plain[name] = paths[0]
        if min(self.options.load_threads, len(plain)) <= 1:
            # One at a time on this thread (its models attach to a running loop, if any, at once); a Python
            # worker still gives up at the timeout.
            for name, path in plain.items():
                self.models[name] = self._load_model(name, path)
            self._load_ensembles(ensembles)
            return
        # Loads wait mostly on worker processes and framework sessions starting: threads overlap them.
        started: dict[str, float] = {}
        pending: dict[Future, tuple[str, Path]] = {}
        for name, path in plain.items():
            pending[self.load_pool().submit(self._timed_load, started, name, path)] = (name, path)
        loaded: dict[str, ModelEntry] = {}
        while pending:
            done, _ = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            for future in done:
                entry = future.result()
                loaded[entry.name] = entry
                del pending[future]
            for future, (name, path) in list(pending.items()):
                if self.overdue(started.get(name)):
                    loaded[name] = self.timed_out(name, path)
                    future.add_done_callback(discard_late)
                    del pending[future]
        self.models.update((name, loaded[name]) for name in plain)  # in the repository's order
        self._load_ensembles(ensembles)

    def load_pool(self) -> ThreadPoolExecutor:
        """The threads every load runs on (start-up and model control), --model-load-thread-count of them: a
        slow or hung load takes one of these, never a thread of the loop's default executor that worker
        restarts and unloads use. The pool lives as long as the repository: a Python model's worker dies with
        the thread that started it (PR_SET_PDEATHSIG), so those threads must not exit while models are loaded."""
        if self._load_pool is None:
            self._load_pool = ThreadPoolExecutor(max(1, self.options.load_threads), thread_name_prefix="naiad-load")
        return self._load_pool

    def _timed_load(self, started: dict[str, float], name: str, path: Path) -> ModelEntry:
        started[name] = time.monotonic()  # the timeout counts from here, not from the wait for a free thread
        return self._load_model(name, path)

    def overdue(self, started: float | None) -> bool:
        """A load that began at ``started`` ran past the timeout and its grace (see LOAD_TIMEOUT_GRACE)."""
        timeout = self.options.load_timeout
        return bool(timeout) and started is not None and time.monotonic() - started > timeout + LOAD_TIMEOUT_GRACE

    def timed_out(self, name: str, path: Path) -> ModelEntry:
        """The entry of a model whose load never returned: every version it has failed, saying why."""
        entry = ModelEntry(name, path, polled=True)
        error = internal(f"load of model '{name}' did not finish within {self.options.load_timeout:g} s "
                         "(--model-load-timeout-secs); it was given up")
        for version in sorted(version_dirs(path)) or [1]:
            self._version_failed(entry, version, error)
        return entry

    def _load_ensembles(self, ensembles: dict[str, Path]) -> None:
        """Ensembles load after the models they compose (nested ones after theirs), as Triton orders them."""
        deps: dict[str, set[str]] = {}
        for name, path in ensembles.items():
            try:
                config, _ = load_config(path, self.options.config_name)
                deps[name] = {step for step, _ in dependencies(config)} & set(ensembles)
            except InferError:
                deps[name] = set()
        remaining = dict(ensembles)
        while remaining:
            ready = [n for n in remaining if not deps[n] & set(remaining)]
            if not ready:
                for name in sorted(remaining):
                    # Any ensemble in the cycle that depends on this one closes it.
                    closing = next((o for o in sorted(remaining) if name in deps[o]), name)
                    cycle = invalid(f"circular dependency between ensembles: {name} -> ... -> {closing} -> {name}")
                    self.models[name] = self._load_model(name, remaining[name], cycle)
                return
            for name in ready:
                self.models[name] = self._load_model(name, remaining.pop(name))

    def _load_model(self, name: str, path: Path, failure: InferError | None = None,
                    override: ModelConfig | None = None) -> ModelEntry:
        """Poll (read and identify the config), then load each selected version, as Triton's two stages do:
        a poll failure hides the model; a load failure is reported per version. ``override`` replaces the
        config file (a load request's ``config`` parameter)."""
        entry = ModelEntry(name, path)
        try:
            if override is not None:
                config, found = override, True
            else:
                config, found = load_config(path, self.options.config_name)
            if not found and not self.options.auto_complete:
                raise invalid(f"failed to find a config.pbtxt for model '{name}' and auto-complete is disabled")
            if not config.name or (path.parent in self.registered and path.name != name):
                config.name = name  # a registered mapping names the model, whatever its folder is called
            validate_identity(config, name)
        except InferError as exc:
            entry.reason = exc.message
            log.error("Poll failed for model directory '%s': %s", name, exc.message)
            return entry
        entry.polled = True
        versions = version_dirs(path)
        selected = select_versions(config, list(versions))
        if not selected:
            entry.reason = f"at least one version must be available under the version policy of model '{name}'"
            log.error("failed to load model '%s': %s", name, entry.reason)
            return entry
        try:
            detect_backend(config, list(versions.values()))
            backend = get_backend(config.backend) if config.backend else None
            based = python_based(config.backend) is not None
            if based:
                config.runtime = "model.py"  # as Triton records a Python-based backend
            folders = [versions[v] for v in selected]
            if backend is not None:
                check_model_file(config, folders)  # before auto-complete, which may run the file
                if self.options.auto_complete:
                    config = backend.auto_complete(config, path, folders)
            fill_defaults(config, name)
            validate(config, name, python_based=based)
            if backend is not None:
                check_model_file(config, folders)  # as auto-complete left it
            ensemble = config.platform == ENSEMBLE_PLATFORM or config.HasField("ensemble_scheduling")
            if ensemble:
                if failure is not None:
                    raise failure
                validate_scheduling(config)
                validate_mapping(config, [self._composing(config, *dep) for dep in dependencies(config)])
            elif backend is None:
                raise invalid(f"unable to find backend for platform '{config.platform}' of model '{name}'")
            else:
                check_gpu_limit(config, self.options.gpu_limits)  # a device already past it: no load to undo
        except InferError as exc:
            for version in selected:
                self._version_failed(entry, version, exc)
            return entry
        entry.config = config
        entry.config_dict = config_to_dict(config)
        config_json = json.dumps(entry.config_dict)
        labels = self._labels(config, path)
        if ensemble:
            for version in selected:
                entry.add_version(version, ModelVersion(name, version, config, entry.config_dict, EnsembleVersion(),
                                                        labels, self.options.response_cache, resolve=self.get))
                log.info("successfully loaded '%s' version %d", name, version)
            return entry
        assert backend is not None
        options = self.options.backend_config.get(config.backend, {})
        # One deadline for the whole model, every version and retry: what the caller waits for is the model.
        deadline = time.monotonic() + self.options.load_timeout if self.options.load_timeout else None
        for version in selected:
            started = time.perf_counter()
            ctx = VersionContext(name, version, config, config_json, path, versions[version], options, self.core,
                                 self.loop, deadline, self.options.load_timeout)
            for attempt in range(self.options.load_retries + 1):
                try:
                    loaded = backend.load(ctx)
                    error = None
                    break
                except InferError as exc:
                    error = exc
                except Exception as exc:  # a model's own bug is a failed load, not a dead server
                    error = internal(f"{type(exc).__name__}: {exc}")
                if deadline is not None and time.monotonic() >= deadline:
                    break  # no time left for another attempt
                if attempt < self.options.load_retries:
                    log.warning("failed to load '%s' version %d (attempt %d of %d): %s", name, version, attempt + 1,
                                self.options.load_retries + 1, error.message)
            if error is None:
                try:
                    check_gpu_limit(config, self.options.gpu_limits)  # what the load took, as Triton checks it
                except InferError as exc:
                    error = exc
                    try:
                        loaded.unload()  # its processes go, and with them what they took on the device
                    except Exception:
                        log.exception("finalize() of '%s' version %d failed", name, version)
            if error is not None:
                self._version_failed(entry, version, error)
                continue
            try:
                model = ModelVersion(name, version, config, entry.config_dict, loaded, labels,
                                     self.options.response_cache, self.options.rate_limiter, path)
            except InferError as exc:
                loaded.unload()
                self._version_failed(entry, version, exc)
                continue
            model.load_seconds = time.perf_counter() - started
            entry.add_version(version, model)
            log.info("successfully loaded '%s' version %d", name, version)
        return entry

    def load_entry(self, name: str, path: Path, override: ModelConfig | None = None) -> ModelEntry:
        """One model, polled and loaded, not yet installed: model control decides whether it replaces the
        entry that serves now. Safe to run off the event loop (it only reads ``models``)."""
        return self._load_model(name, path, override=override)

    def _composing(self, config: ModelConfig, model: str, version: int) -> ModelConfig:
        """The config of the version a step runs on, or why the ensemble can't load (Triton's words)."""
        ensemble = config.name
        entry = self.models.get(model)
        if entry is None or (not entry.polled and not entry.reason):
            missing = sorted({s for s, _ in dependencies(config) if s not in self.models})
            raise invalid(
                f"ensemble {ensemble} contains models that are not available or ambiguous: {', '.join(missing)}"
            )
        if not entry.polled:
            raise invalid(
                f"ensemble '{ensemble}' depends on '{model}' which is not valid. Model '{model}' failed with error: "
                f"{entry.reason}"
            )
        if not entry.versions:
            reason = entry.reason or next(iter(entry.failed.values()), "")
            raise invalid(
                f"ensemble '{ensemble}' depends on '{model}' which has no loaded version. Model '{model}' loading "
                f"failed with error: {reason}"
            )
        if version >= 0 and version not in entry.versions:
            raise invalid(f"ensemble '{ensemble}' depends on '{model}' whose required version {version} is not loaded.")
        chosen = entry.versions[version] if version >= 0 else entry.latest()
        assert chosen is not None
        return chosen.config

    async def warm_up(self) -> None:
        """Run every loaded version's ``model_warmup``; a version whose warmup fails is unloaded and reported,
        so none is READY before its warmup completed."""
        for entry in self.models.values():
            await self.warm_up_entry(entry)

    async def warm_up_entry(self, entry: ModelEntry) -> None:
        for version, model in list(entry.versions.items()):
            if not model.config.model_warmup:
                continue
            try:
                await warm_up(model, entry.path)
            except InferError as exc:
                error = exc
            except Exception as exc:  # a model's own bug is a failed load, not a dead server
                error = internal(f"{type(exc).__name__}: {exc}")
            else:
                continue
            entry.remove_version(version)
            try:
                model.unload()
            except Exception:
                log.exception("finalize() of '%s' version %d failed", entry.name, version)
            self._version_failed(entry, version, error)

    @staticmethod
    def _version_failed(entry: ModelEntry, version: int, error: InferError) -> None:
        # Triton states the reason with its status name first ("Invalid argument: ...").
        entry.failed[version] = f"{STATUS_NAMES[error.code]}: {error.message}"
        log.error("failed to load '%s' version %d: %s", entry.name, version, entry.failed[version])

    @staticmethod
    def _labels(config: ModelConfig, path: Path) -> dict[str, list[str]]:
        labels: dict[str, list[str]] = {}
        for output in config.output:
            if output.label_filename:
                try:
                    labels[output.name] = (path / output.label_filename).read_text().splitlines()
                except OSError as exc:
                    log.warning("model '%s': cannot read label file %s: %s", config.name, output.label_filename, exc)
        return labels

    # --- lookup -------------------------------------------------------------------------------------------------

    def entry(self, name: str) -> ModelEntry:
        entry = self.models.get(name)
        if entry is None:
            raise not_found(f"Request for unknown model: '{name}' is not found")
        return entry

    def get(self, name: str, version: str = "") -> ModelVersion:
        """The version that serves a request: the newest ready one unless a version is named."""
        entry = self.models.get(name)
        if entry is None or not entry.polled:
            # Unknown, or never got past polling: Triton has no such model at all.
            raise not_found(f"Request for unknown model: '{name}' is not found")
        if not version:
            model = entry.newest
            if model is None:
                # Triton's words, which clients match; then why, when a load failed.
                why = "; ".join(f"version {v} failed to load: {r}" for v, r in sorted(entry.failed.items()))
                why = why or (f"it failed to load: {entry.reason}" if entry.reason else "")
                raise not_found(f"Request for unknown model: '{name}' has no available versions"
                                + (f" ({why})" if why else ""))
            return model
        try:
            number = int(version)
        except ValueError:
            raise invalid(f"failed to parse model version '{version}' for model '{name}'") from None
        model = entry.versions.get(number)
        if model is None:
            if number in entry.failed:
                raise unavailable(f"Request for unknown model: '{name}' version {number} is not at ready state")
            raise not_found(f"Request for unknown model: '{name}' version {number} is not found")
        return model

    def is_ready(self, name: str, version: str = "") -> bool:
        try:
            return self.get(name, version).ready
        except InferError:
            return False

    def all_ready(self) -> bool:
        # Models unloaded on request don't count: Triton's readiness covers the models it was asked to serve.
        return all((e.ready or e.unloaded) and not e.failed and all(m.ready for m in e.versions.values())
                   for e in self.models.values())

    def index(self, ready_only: bool = False, listed: set[str] | None = None) -> list[dict[str, str]]:
        """Triton's repository index; ``listed`` names models on disk that were never loaded (explicit and
        poll modes list them by name only)."""
        rows: list[dict[str, str]] = []
        for name in sorted(set(self.models) | set(self.loading) | (listed or set())):
            entry = self.models.get(name) or ModelEntry(name, Path())
            loading = self.loading.get(name, set())
            versions = set(entry.versions) | set(entry.failed) | entry.unloaded | entry.unloading | loading
            if not versions and name not in self.models:
                if not ready_only:
                    rows.append({"name": name})
                continue
            for version in sorted(versions):
                if version in entry.versions:
                    rows.append({"name": name, "version": str(version), "state": "READY"})
                elif ready_only:
                    continue
                elif version in loading:
                    rows.append({"name": name, "version": str(version), "state": "LOADING"})
                elif version in entry.unloading:
                    rows.append({"name": name, "version": str(version), "state": "UNLOADING"})
                elif version in entry.failed:
                    rows.append({"name": name, "version": str(version), "state": "UNAVAILABLE",
                                 "reason": entry.failed[version]})
                else:
                    rows.append({"name": name, "version": str(version), "state": "UNAVAILABLE",
                                 "reason": "unloaded"})
            if not versions and not ready_only:
                rows.append({"name": name, "state": "UNAVAILABLE", "reason": entry.reason})
        return rows

    def unload_all(self, deadline: float | None = None) -> None:
        """Finalize every version (shutdown); with a ``deadline`` (``time.monotonic()``) all of them are asked at
        once and what has not finished by then is stopped by force."""
        if deadline is not None:
            for entry in self.models.values():
                for model in entry.versions.values():
                    model.scheduler.stop()
                    model.loaded.begin_unload()
        for entry in self.models.values():
            for version, model in list(entry.versions.items()):
                try:
                    model.unload(deadline)
                except Exception:
                    log.exception("finalize() of '%s' version %d failed", entry.name, version)
            entry.clear_versions()
        if self._load_pool is not None:
            self._load_pool.shutdown(wait=False)
            self._load_pool = None


def discard_late(future: Future) -> None:
    """A load given up at its timeout finished after all: nobody serves what it loaded, so it is unloaded."""
    if future.cancelled() or future.exception() is not None:
        return
    entry: ModelEntry = future.result()
    for version, model in entry.versions.items():
        log.warning("load of '%s' version %d finished after its timeout; unloading it", entry.name, version)
        try:
            model.unload()
        except Exception:
            log.exception("finalize() of '%s' version %d failed", entry.name, version)
    entry.clear_versions()
