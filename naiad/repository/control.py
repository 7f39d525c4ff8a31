"""Model control as Triton's ``--model-control-mode`` defines it: ``none`` (load everything once),
``explicit`` (load and unload on request, ``--load-model`` at start-up) and ``poll`` (follow the repository).

Loads run on the repository's load pool (a model's ``initialize()`` and worker-process start-up may take
seconds), so the event loop keeps serving the other models meanwhile, and a load that hangs takes one of its
threads and fails at ``--model-load-timeout-secs`` while the others go on. The new versions replace the old ones only once
they loaded; the old ones then drain their in-flight requests before ``finalize()``. A reload that fails
keeps the previous versions serving, as Triton does.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import re
import shutil
import tempfile
import time
from pathlib import Path, PurePosixPath
from typing import Any

from google.protobuf import json_format

from naiad.config import ModelConfig
from naiad.config.ensemble import ENSEMBLE_PLATFORM, dependencies
from naiad.config.loader import load_config
from naiad.core.errors import InferError, internal, invalid, unavailable
from naiad.repository.consent import FLAG, CodeConsent, code_in, refusal
from naiad.repository.layout import version_dirs
from naiad.repository.manager import LOAD_TIMEOUT_GRACE, ModelEntry, ModelRepository, discard_late
from naiad.repository.model import ModelVersion

log = logging.getLogger("naiad.repository")

MODES = ("none", "explicit", "poll")


def _poll_failed(name: str, why: str = "") -> InferError:
    # Triton's words, which clients match; what to do about it after them.
    return internal(f"failed to load '{name}', failed to poll from model repository{f' ({why})' if why else ''}")


def _not_one_folder(name: str, paths: list[Path], roots: list[Path]) -> str:
    if paths:
        return f"a folder '{name}' is in several model repositories: {', '.join(str(p.parent) for p in paths)}"
    return f"no model folder '{name}' in the model repository {', '.join(str(r) for r in roots)}"


def _load_failed(entry: ModelEntry) -> InferError:
    reasons = "".join(f"version {v} is at UNAVAILABLE state: {r};\n" for v, r in sorted(entry.failed.items()))
    return invalid(f"load failed for model '{entry.name}': {reasons}")


def _parsed(config: str | None) -> ModelConfig | None:
    """A load's config override, or None when there is none or it doesn't parse (the load then says so)."""
    if config is None:
        return None
    try:
        return json_format.Parse(config, ModelConfig())
    except (json_format.ParseError, ValueError):
        return None


def decode_files(parameters: dict[str, Any], base64_encoded: bool) -> dict[str, bytes]:
    """A load request's ``file:<version>/<name>`` parameters (HTTP sends them base64-encoded)."""
    files: dict[str, bytes] = {}
    for key, value in parameters.items():
        if not key.startswith("file:"):
            continue
        if base64_encoded:
            if not isinstance(value, str):
                raise internal("attempt to access JSON non-string as string")
            try:
                value = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise invalid(f"failed to decode the base64 content of '{key}'") from None
        files[key[len("file:"):]] = bytes(value)
    return files


def _write_files(name: str, files: dict[str, bytes]) -> Path:
    """The files of a load request, as a model folder of their own (Triton loads such a model from a
    temporary folder too)."""
    # The name only labels the folder: one no file system takes (too long, a NUL byte) must not fail the load.
    label = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64]
    root = Path(tempfile.mkdtemp(prefix=f"naiad-{label}-"))
    for relative, content in files.items():
        path = PurePosixPath(relative)
        if path.is_absolute() or ".." in path.parts or not path.parts:
            shutil.rmtree(root, ignore_errors=True)
            raise invalid(f"invalid file path '{relative}' for model '{name}'")
        target = root.joinpath(*path.parts)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        except (OSError, ValueError) as exc:  # a name too long, or with a NUL byte: the request fails, not the server
            shutil.rmtree(root, ignore_errors=True)
            log.error("failed to write '%s' for model '%s': %s", relative, name, getattr(exc, "strerror", None) or exc)
            raise _poll_failed(name) from None
    return root


def _is_ensemble(config: ModelConfig) -> bool:
    return config.platform == ENSEMBLE_PLATFORM or config.HasField("ensemble_scheduling")


def _fingerprint(paths: list[Path]) -> tuple:
    """What tells a changed model from an unchanged one: every file's path, size and modification time,
    and the configs' text (Triton doesn't reload a model whose config file was only touched)."""
    items: list[tuple] = []
    for root in paths:
        for path in sorted(root.rglob("*")):
            if "__pycache__" in path.parts:
                continue
            try:
                if path.suffix == ".pbtxt":
                    items.append((str(path), path.read_bytes()))
                else:
                    st = path.stat()
                    items.append((str(path), st.st_size, st.st_mtime_ns))
            except OSError:
                continue
    return tuple(items)


class ModelControl:
    def __init__(self, repository: ModelRepository, mode: str = "none", startup_models: list[str] | None = None,
                 poll_secs: float = 15.0, code_upload: bool = False) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown model control mode '{mode}'")
        if startup_models and mode != "explicit":
            raise ValueError("--load-model requires --model-control-mode=explicit")
        self.repository = repository
        self.mode = mode
        self.startup_models = startup_models or []
        self.poll_secs = poll_secs
        self.code_upload = code_upload  # --allow-model-code-upload: any client may load code (consent.py)
        self._locks: dict[str, asyncio.Lock] = {}
        self._retiring: set[asyncio.Task] = set()
        self._seen: dict[str, tuple] = {}  # poll mode: model -> fingerprint at the last scan
        self._poller: asyncio.Task | None = None

    # --- start-up and shutdown -------------------------------------------------------------------------------

    def load_startup(self) -> None:
        if self.mode == "explicit" and "*" not in self.startup_models:
            named = set(self.startup_models)
            # An ensemble named by --load-model brings the models it is made of (Triton loads them too).
            wanted = self._with_composing(named)
            self.repository.load_all(wanted)
            for name in wanted - named:
                if name in self.repository.models:
                    self.repository.models[name].explicit = False
        else:
            self.repository.load_all()
        if self.mode == "none":
            return
        prints = {n: _fingerprint(p) for n, p in self.repository.scan().items()}
        for name, fingerprint in prints.items():
            if name in self.repository.models:
                self.repository.models[name].fingerprint = fingerprint
        if self.mode == "poll":
            self._seen = prints

    def _with_composing(self, names: set[str]) -> set[str]:
        """``names`` and, through nested ensembles, every model their ensembles' steps name."""
        found = self.repository.scan()
        wanted = set(names)
        todo = sorted(names)
        while todo:
            paths = found.get(todo.pop(), [])
            if len(paths) != 1:
                continue
            try:
                config, _ = load_config(paths[0], self.repository.options.config_name)
            except InferError:
                continue  # its own load reports the broken config
            if not _is_ensemble(config):
                continue
            for step, _ in dependencies(config):
                if step not in wanted:
                    wanted.add(step)
                    todo.append(step)
        return wanted

    def start_polling(self) -> None:
        if self.mode == "poll" and self.poll_secs > 0:
            self._poller = asyncio.ensure_future(self._poll_forever())

    async def close(self) -> None:
        """Stop polling and let versions already being retired finish their ``finalize()``."""
        if self._poller is not None:
            self._poller.cancel()
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)

    async def settle(self) -> None:
        """Wait until every version being retired has finished ``finalize()`` (its workers are gone)."""
        while self._retiring:
            await asyncio.gather(*list(self._retiring), return_exceptions=True)

    # --- what the protocols ask ------------------------------------------------------------------------------

    def listed(self) -> set[str] | None:
        """Models on disk the index names even when not loaded (Triton lists them outside 'none' mode)."""
        return set(self.repository.scan()) if self.mode != "none" else None

    def _allowed(self) -> None:
        if self.mode != "explicit":
            raise unavailable("explicit model load / unload is not allowed if polling is enabled")

    async def load(self, name: str, config: str | None = None, files: dict[str, bytes] | None = None,
                   consent: CodeConsent | None = None) -> None:
        """A client's load request: load the model, or reload it with its new versions / config. ``consent``: the
        front end's (None: a caller inside the server, a model's ``pb_utils.load_model``)."""
        self._allowed()
        if consent is not None and not (self.code_upload or consent.keyed):
            what = code_in(_parsed(config), files, self._own_configs(name))
            if what is not None:
                log.error("refused to load '%s': it carries %s (no %s, model-repository not restricted)", name,
                          what, FLAG)
                raise refusal(what, consent)
        await self.load_model(name, config, files)

    def _own_configs(self, name: str) -> list[ModelConfig]:
        """The operator's configs of a model: its config file, and the config it serves with."""
        own = []
        paths = self.repository.scan().get(name, [])
        if len(paths) == 1:
            try:
                config, found = load_config(paths[0], self.repository.options.config_name)
                if found:
                    own.append(config)
            except InferError:
                pass
        entry = self.repository.models.get(name)
        if entry is not None and entry.config is not None:
            own.append(entry.config)
        return own

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        self._allowed()
        await self.unload_model(name, unload_dependents)

    # --- loading ---------------------------------------------------------------------------------------------

    def _lock(self, name: str) -> asyncio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock

    async def load_model(self, name: str, config: str | None = None, files: dict[str, bytes] | None = None,
                         _visiting: frozenset[str] = frozenset(), explicit: bool = True) -> None:
        """Load (or reload) ``name``; ``explicit`` False: only as a composing model of an ensemble being loaded."""
        override: ModelConfig | None = None
        if config is not None:
            try:
                override = json_format.Parse(config, ModelConfig())
            except (json_format.ParseError, ValueError) as exc:
                log.error("failed to load '%s': the config parameter is not a model config: %s", name, exc)
                raise _poll_failed(name) from None
        elif files:
            raise _poll_failed(name)  # Triton takes files only along with the config they belong to
        paths = self.repository.scan().get(name, [])
        if not files and len(paths) != 1:
            raise _poll_failed(name, _not_one_folder(name, paths, self.repository.options.paths))
        current = self.repository.models.get(name)
        fingerprint = _fingerprint(paths) if override is None else None
        if (fingerprint is not None and current is not None and current.versions
                and current.fingerprint == fingerprint):
            current.explicit |= explicit  # asked for by name now: it stays when an ensemble using it goes
            return  # loaded from these very files already: Triton keeps the versions that serve
        await self._load_composing(name, override, paths, _visiting | {name})
        async with self._lock(name):
            scratch = _write_files(name, files) if files else None
            path = scratch if scratch is not None else paths[0]
            self.repository.loading[name] = set(version_dirs(path)) if path.is_dir() else set()
            try:
                entry = await self._load_entry(name, path, override)
                await self.repository.warm_up_entry(entry)
            except BaseException:
                if scratch is not None:
                    shutil.rmtree(scratch, ignore_errors=True)
                raise
            finally:
                del self.repository.loading[name]
            entry.scratch = scratch
            entry.fingerprint = fingerprint
            old = self.repository.models.get(name)
            entry.explicit = explicit or bool(old is not None and old.versions and old.explicit)
            self._install(name, entry)

    async def _load_entry(self, name: str, path: Path, override: ModelConfig | None) -> ModelEntry:
        """The model loaded on the load pool. A load that runs past --model-load-timeout-secs (and its grace)
        without returning is given up: its versions fail, and whatever it loads later is unloaded."""
        loop = asyncio.get_running_loop()
        started: asyncio.Future[float] = loop.create_future()

        def begin() -> None:
            if not started.done():
                started.set_result(time.monotonic())

        def load() -> ModelEntry:
            loop.call_soon_threadsafe(begin)
            return self.repository.load_entry(name, path, override)

        future = self.repository.load_pool().submit(load)
        loading = asyncio.wrap_future(future)
        timeout = self.repository.options.load_timeout
        try:
            if not timeout:
                return await loading
            # The clock starts when a thread takes the load, not while it waits for one.
            either: list[asyncio.Future[Any]] = [loading, started]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if loading.done():
                return loading.result()
            left = timeout + LOAD_TIMEOUT_GRACE - (time.monotonic() - started.result())
            return await asyncio.wait_for(asyncio.shield(loading), max(0.0, left))
        except asyncio.TimeoutError:
            future.add_done_callback(discard_late)
            log.error("load of '%s' did not return within %g s (--model-load-timeout-secs); giving it up", name,
                      timeout)
            return self.repository.timed_out(name, path)
        except asyncio.CancelledError:
            future.add_done_callback(discard_late)  # nobody will install what it loads
            raise

    async def _load_composing(self, name: str, override: ModelConfig | None, paths: list[Path],
                              visiting: frozenset[str]) -> None:
        """Loading an ensemble loads the models it is composed of that aren't loaded yet (Triton does)."""
        config = override
        if config is None and len(paths) == 1:
            try:
                config, _ = load_config(paths[0], self.repository.options.config_name)
            except InferError:
                return
        if config is None or not _is_ensemble(config):
            return
        for step, _ in dependencies(config):
            entry = self.repository.models.get(step)
            if step in visiting or (entry is not None and entry.versions):
                continue
            try:
                await self.load_model(step, _visiting=visiting, explicit=False)
            except InferError as exc:
                # The ensemble's own load says which composing model is missing, in Triton's words.
                log.error("failed to load '%s' for ensemble '%s': %s", step, name, exc.message)

    def _install(self, name: str, entry: ModelEntry) -> None:
        if not entry.polled:
            if entry.scratch is not None:
                shutil.rmtree(entry.scratch, ignore_errors=True)
            raise _poll_failed(name)
        old = self.repository.models.get(name)
        if entry.failed and old is not None and old.versions:
            # A failed reload leaves the versions that were serving in place.
            self._retire(None, list(entry.versions.values()), entry.scratch)
            raise _load_failed(entry)
        self.repository.models[name] = entry
        if old is not None:
            entry.unloaded = (old.unloaded | set(old.versions)) - set(entry.versions) - set(entry.failed)
            self._retire(old, list(old.versions.values()), old.scratch)
        if entry.failed:
            raise _load_failed(entry)
        log.info("loaded model '%s' (versions %s)", name, ", ".join(map(str, sorted(entry.versions))))

    # --- unloading -------------------------------------------------------------------------------------------

    async def unload_model(self, name: str, unload_dependents: bool = False,
                           _visiting: frozenset[str] = frozenset()) -> None:
        """Stop routing requests to the model now; its versions finish what they hold, then ``finalize()``.
        Unloading a model that isn't loaded succeeds, as in Triton. Ensembles that use the model go with it
        (Triton unloads them too); ``unload_dependents`` also unloads an ensemble's composing models that were
        loaded only for an ensemble and that no loaded model uses any more (Triton's cascading removal)."""
        visiting = _visiting | {name}
        async with self._lock(name):
            entry = self.repository.models.get(name)
            if entry is None or not (entry.versions or entry.failed):
                return
            versions = list(entry.versions.values())
            entry.unloaded |= set(entry.versions) | set(entry.failed)
            entry.clear_versions()
            entry.failed.clear()
            entry.unloading |= {m.version for m in versions}
            self._retire(entry, versions, entry.scratch)
            entry.scratch = None
            config = entry.config
        for other in sorted(self.repository.models):
            users = self.repository.models[other]
            if (other not in visiting and users.versions and users.config is not None
                    and name in {step for step, _ in dependencies(users.config)}):
                await self.unload_model(other, False, visiting)
        if unload_dependents and config is not None and _is_ensemble(config):
            for step, _ in dependencies(config):
                composing = self.repository.models.get(step)
                if (step not in visiting and composing is not None and not composing.explicit
                        and not self._used_by_others(step, visiting)):
                    await self.unload_model(step, True, visiting)

    def _used_by_others(self, name: str, leaving: frozenset[str]) -> bool:
        """Some loaded model outside ``leaving`` is an ensemble with a step on ``name``."""
        return any(other not in leaving and entry.versions and entry.config is not None and _is_ensemble(entry.config)
                   and name in {step for step, _ in dependencies(entry.config)}
                   for other, entry in self.repository.models.items())

    def _retire(self, entry: ModelEntry | None, versions: list[ModelVersion], scratch: Path | None) -> None:
        task = asyncio.ensure_future(self._finish(entry, versions, scratch))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _finish(self, entry: ModelEntry | None, versions: list[ModelVersion], scratch: Path | None) -> None:
        loop = asyncio.get_running_loop()
        for model in versions:
            await model.drain()
            try:
                await loop.run_in_executor(None, model.unload)
            except Exception:
                log.exception("finalize() of '%s' version %d failed", model.name, model.version)
            if entry is not None:
                entry.unloading.discard(model.version)
            log.info("successfully unloaded '%s' version %d", model.name, model.version)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)

    # --- poll mode -------------------------------------------------------------------------------------------

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.poll_secs)
            try:
                await self.poll()
            except Exception:
                log.exception("polling the model repository failed")

    async def poll(self) -> None:
        """Load new models, reload changed ones and unload the ones whose folder disappeared."""
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(
            None, lambda: {n: _fingerprint(p) for n, p in self.repository.scan().items()})
        for name in sorted(set(self._seen) - set(found)):
            await self.unload_model(name)
        for name in sorted(found):
            if self._seen.get(name) == found[name]:
                continue
            try:
                await self.load_model(name)
            except InferError as exc:
                log.error("poll: failed to load '%s': %s", name, exc.message)
        self._seen = found
