"""Execution environments: ``parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "..." } }``.

As in Triton's python backend, the value is a conda-pack / venv-pack ``.tar.gz`` or an unpacked folder;
``$$TRITON_MODEL_DIRECTORY`` stands for the model's folder (so ``$$TRITON_MODEL_DIRECTORY/../envs/x.tar.gz``
lets several models share one archive) and any other relative path is taken from the server's working
directory (Triton resolves it with ``realpath``). The environment must hold ``bin/activate``.

Unlike Triton (which unpacks into a fresh temp folder per server, keyed by path and mtime), archives are
unpacked into a cache keyed by their content: models and servers naming the same bytes share one folder,
and a restart doesn't unpack a large conda env again. The cache is ``$NAIAD_PYTHON_ENV_CACHE``, else
``<tmp>/naiad_python_envs_<uid>`` (an environment variable rather than a backend setting because
auto-complete, which runs in the environment too, happens before backend settings reach the model).

Triton's stub links the environment's libpython; naiad's worker is Python, so it runs on the environment's
own ``bin/python3`` with only the ``naiad`` package added to its path. That interpreter must therefore be
able to import naiad's worker (it needs numpy); this is checked once per environment so a missing numpy is
a clear load failure instead of a worker dying on start. Its Python version may differ from the server's:
the worker's handshake says so, and the channel then speaks pickle instead of marshal (see messages.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from naiad.backends.base import VersionContext
from naiad.core.errors import Code, InferError, internal

if TYPE_CHECKING:
    from naiad.backends.python.process import WorkerSpec

log = logging.getLogger("naiad.python")

PARAMETER = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"
CACHE_VARIABLE = "NAIAD_PYTHON_ENV_CACHE"
_NAIAD_PACKAGE = Path(__file__).resolve().parents[2]  # .../naiad

# Loads may run side by side; one lock keeps two models from unpacking the same archive at once.
_lock = threading.Lock()
# (path, size, mtime, inode) -> content digest, so a second model naming the same archive doesn't hash it again.
_digests: dict[tuple[str, int, int, int], str] = {}
# Unpacked (content-addressed, so immutable) environments that already passed the worker check.
_checked: set[str] = set()


@dataclass
class ExecutionEnvironment:
    """An unpacked environment, and how a worker runs in it."""

    root: Path
    python: str
    env: dict[str, str] = field(default_factory=dict)
    python_path: list[str] = field(default_factory=list)

    def apply(self, spec: WorkerSpec) -> None:
        spec.python = self.python
        spec.env = {**spec.env, **self.env}
        spec.python_path = list(self.python_path)


def cache_root() -> Path:
    configured = os.environ.get(CACHE_VARIABLE)
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"naiad_python_envs_{os.getuid()}"


def resolve_environment(ctx: VersionContext) -> ExecutionEnvironment | None:
    if PARAMETER not in ctx.config.parameters or not ctx.config.parameters[PARAMETER].string_value:
        return None
    return resolve(ctx.config.parameters[PARAMETER].string_value, ctx.model_dir, ctx.name)


def resolve(value: str, model_dir: Path, model_name: str) -> ExecutionEnvironment:
    """The environment a model's ``EXECUTION_ENV_PATH`` names, unpacked and checked."""
    path = value.replace(MODEL_DIRECTORY, str(model_dir))
    log.info("Using Python execution env %s", path)
    if not os.path.exists(path):
        raise internal(f"Failed to get the canonical path for {path}. (EXECUTION_ENV_PATH of model "
                       f"'{model_name}': no such file or folder)")
    canonical = Path(os.path.realpath(path))
    cache = cache_root()
    with _lock:
        root = canonical if canonical.is_dir() else _unpack(canonical, cache)
        activate = root / "bin" / "activate"
        if not activate.is_file():
            raise internal(f"Path {activate} does not exist. The Python environment should contain an "
                           "'activate' script.")
        python = next((str(root / "bin" / n) for n in ("python3", "python") if (root / "bin" / n).exists()), None)
        if python is None:
            raise internal(f"the Python execution environment {root} has no bin/python3 or bin/python interpreter")
        environment = ExecutionEnvironment(root, python, _variables(root), [str(_naiad_only(cache))])
        if root.parent != cache or str(root) not in _checked:  # a folder may change between loads: always check
            _check(environment, canonical)
            if root.parent == cache:
                _checked.add(str(root))
    return environment


def _variables(root: Path) -> dict[str, str]:
    """What sourcing ``bin/activate`` would set, as Triton's stub launcher sets it."""
    return {
        "VIRTUAL_ENV": str(root),
        "VIRTUAL_ENV_PROMPT": f"({root})",
        "PATH": os.pathsep.join([str(root / "bin")] + ([os.environ["PATH"]] if os.environ.get("PATH") else [])),
        "LD_LIBRARY_PATH": os.pathsep.join(
            [str(root / "lib")] + ([os.environ["LD_LIBRARY_PATH"]] if os.environ.get("LD_LIBRARY_PATH") else [])),
        # activate unsets PYTHONHOME; Python ignores an empty one, and the worker's env can only add keys.
        "PYTHONHOME": "",
    }


def _digest(archive: Path) -> str:
    st = archive.stat()
    key = (str(archive), st.st_size, st.st_mtime_ns, st.st_ino)
    digest = _digests.get(key)
    if digest is None:
        h = hashlib.sha256()
        with open(archive, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        digest = _digests[key] = h.hexdigest()[:32]
    return digest


def _unpack(archive: Path, cache: Path) -> Path:
    """The archive's folder in the cache, unpacking it first if no model (or server) has."""
    try:
        cache.mkdir(parents=True, exist_ok=True)
        target = cache / _digest(archive)
    except OSError as exc:
        raise internal(f"failed to prepare the Python execution environment {archive}: {exc}") from None
    if target.is_dir():
        return target
    log.info("Extracting Python execution env %s into %s", archive, target)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=cache))
    try:
        # The 'tar' filter refuses members that would land outside the folder (absolute or ``..`` names,
        # writes through links), like Triton's libarchive flags, but keeps venvs' symlinks to the base python.
        with tarfile.open(archive, "r:*") as tar:
            tar.extractall(staging, filter="tar")
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise internal(f"failed to extract the Python execution environment {archive}: it must be a folder or a "
                       f"conda-pack / venv-pack .tar.gz archive ({type(exc).__name__}: {exc})") from None
    try:
        os.rename(staging, target)  # atomic: other servers see a whole environment or none
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # another server finished first; its copy has the same bytes
        if not target.is_dir():
            raise
    return target


def _naiad_only(cache: Path) -> Path:
    """A folder holding just a link to the ``naiad`` package: on the environment's path it adds naiad and nothing
    else (the folder that holds naiad may be the server's site-packages, whose packages must not leak in)."""
    folder = cache / f"naiad-{hashlib.sha256(str(_NAIAD_PACKAGE).encode()).hexdigest()[:16]}"
    link = folder / "naiad"
    if not link.exists():
        folder.mkdir(parents=True, exist_ok=True)
        staging = folder / f".naiad-{os.getpid()}"
        if staging.is_symlink():
            staging.unlink()
        staging.symlink_to(_NAIAD_PACKAGE, target_is_directory=True)
        os.replace(staging, link)
    return folder


_PROBE = "import sys; import naiad.backends.python.worker; print('%d.%d' % sys.version_info[:2])"


def _process_env(environment: ExecutionEnvironment) -> dict[str, str]:
    """A process's environment as the worker gets it (process.py puts naiad's folder before any PYTHONPATH)."""
    inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    return {**os.environ, **environment.env, "PYTHONPATH": os.pathsep.join(environment.python_path + inherited)}


def _check(environment: ExecutionEnvironment, source: Path) -> None:
    """Run the environment's interpreter once the way a worker would, and say why it can't host one."""
    env = _process_env(environment)
    try:
        done = subprocess.run([environment.python, "-c", _PROBE], check=False, env=env, capture_output=True, text=True,
                              timeout=120, start_new_session=True)  # as the workers: the server's signals aren't its
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise internal(f"the Python execution environment {source} cannot run its interpreter "
                       f"{environment.python}: {exc}") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit code {done.returncode}"
        hint = " (the environment must provide numpy)" if "numpy" in reason else ""
        raise internal(f"the Python execution environment {source} cannot run the python backend's worker with "
                       f"{environment.python}: {reason}{hint}")
    log.info("Python execution env %s runs Python %s", environment.root, done.stdout.strip())


def auto_complete_in_environment(value: str, model_dir: Path, model_file: Path, name: str,
                                 config: dict[str, Any]) -> dict[str, Any] | None:
    """Run the model's ``auto_complete_config`` on the environment's interpreter (see autocomplete.py)."""
    from naiad.backends.python.autocomplete import run_isolated  # it imports pb_utils: only when a hook runs

    environment = resolve(value, model_dir, name)
    return run_isolated(environment.python, _process_env(environment), model_file, name, config)
