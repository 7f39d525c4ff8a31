"""The classic tuning table for one model folder: base, dynamic batching, instance group x2 and both, per backend.

Each variant is a ``ModelConfig`` written with protobuf's text format into a repository of its own, whose model
folder links to the original version folders (models can be large; nothing is copied).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import text_format

from naiad.config import ModelConfig
from naiad.config.loader import load_config
from naiad.config.normalize import BACKEND_PLATFORMS, DEFAULT_FILENAMES, PLATFORM_BACKENDS, detect_backend
from naiad.core.errors import InferError
from naiad.repository.layout import version_dirs

# Exports that stand for the same model under another backend when they sit beside each other.
FRAMEWORK_BACKENDS = ("onnxruntime", "pytorch", "tensorrt")

# The Python module each backend needs in naiad's own process.
BACKEND_MODULES = {"onnxruntime": "onnxruntime", "pytorch": "torch", "tensorrt": "tensorrt"}

KINDS = (
    ("base", False, False),
    ("dynamic batching", True, False),
    ("instance group x2", False, True),
    ("dynamic batching + instance group x2", True, True),
)


@dataclass
class Variant:
    backend: str
    kind: str              # one of KINDS' names
    config: ModelConfig
    label: str = ""        # kind, prefixed with the backend when the model has several

    @property
    def slug(self) -> str:
        """A folder name: 'onnxruntime-dynamic_batching-instance_x2'."""
        kind = self.kind.replace(" + ", "-").replace("instance group", "instance").replace(" ", "_")
        return f"{self.backend}-{kind}"

    def text(self) -> str:
        return f"# naiad recommend: {self.label or self.kind}\n" + text_format.MessageToString(self.config)


@dataclass
class Plan:
    model: str
    model_dir: Path
    variants: list[Variant] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)   # (label, why)


def installed(backend: str) -> str | None:
    """Why naiad cannot serve ``backend`` here, or None when it can."""
    module = BACKEND_MODULES.get(backend)
    if module and importlib.util.find_spec(module) is None:
        return f"{module} is not installed"
    return None


def _own_backend(config: ModelConfig, versions: list[Path]) -> str:
    probe = ModelConfig()
    probe.CopyFrom(config)
    detect_backend(probe, versions)
    return probe.backend or PLATFORM_BACKENDS.get(probe.platform, probe.platform)


def _exports(versions: list[Path]) -> list[str]:
    return [b for b in FRAMEWORK_BACKENDS if any((d / DEFAULT_FILENAMES[b]).is_file() for d in versions)]


def _for_backend(config: ModelConfig, own: str, backend: str, explicit: bool) -> ModelConfig:
    out = ModelConfig()
    out.CopyFrom(config)
    if backend != own:
        # Another export of the same model: its backend's file, and none of the other backend's settings.
        out.backend = backend
        out.platform = BACKEND_PLATFORMS.get(backend, "")
        out.default_model_filename = DEFAULT_FILENAMES[backend]
        out.ClearField("parameters")
        out.optimization.ClearField("execution_accelerators")
    elif explicit and not out.backend:
        # Several exports in one folder: name the backend so the server cannot pick another file.
        out.backend = backend
    return out


def _dynamic_batching(config: ModelConfig, queue_delay_us: int | None) -> str | None:
    """Add ``dynamic_batching``; the reason it does not apply otherwise."""
    if config.HasField("sequence_batching"):
        return "the model uses the sequence batcher"
    if config.max_batch_size == 0 and config.input:
        # (With no inputs in the config the server auto-completes max_batch_size, so batching may well apply.)
        return "max_batch_size is 0: the model does not batch"
    config.dynamic_batching.SetInParent()
    if queue_delay_us is not None:
        config.dynamic_batching.max_queue_delay_microseconds = queue_delay_us
    return None


def _double_instances(config: ModelConfig) -> None:
    if not config.instance_group:
        config.instance_group.add().count = 2
        return
    for group in config.instance_group:
        group.count = max(group.count, 1) * 2


def plan(model_dir: Path, *, available: Callable[[str], str | None] | None = installed,
         queue_delay_us: int | None = None) -> Plan:
    """The variants of ``model_dir`` (a model folder of a repository). ``available`` says why a backend cannot be
    served (None: try every backend, as with a user-supplied server command)."""
    model_dir = model_dir.resolve()
    if not model_dir.is_dir():
        raise ValueError(f"{model_dir} is not a folder: give one model folder of a repository, <repo>/<model>")
    try:
        config, _ = load_config(model_dir)
    except InferError as exc:   # a config.pbtxt that does not parse
        raise ValueError(exc.message) from None
    if config.platform == "ensemble":
        raise ValueError(f"{model_dir.name} is an ensemble: recommend its composing models one by one")
    versions = list(version_dirs(model_dir).values())
    if not versions:
        raise ValueError(f"no version folder (e.g. {model_dir}/1) in {model_dir}")
    own = _own_backend(config, versions)
    if not own:
        raise ValueError(f"no model file found in the versions of {model_dir}")
    backends = [own] + [b for b in _exports(versions) if b != own]
    result = Plan(model=model_dir.name, model_dir=model_dir)
    several = len(backends) > 1
    for backend in backends:
        why = available(backend) if available else None
        for kind, batching, doubled in KINDS:
            label = f"{backend}: {kind}" if several else kind
            if why:
                result.skipped.append((label, why))
                continue
            variant_config = _for_backend(config, own, backend, several)
            if batching:
                if variant_config.HasField("dynamic_batching"):
                    result.skipped.append((label, "same as base: the config already has dynamic_batching"))
                    continue
                reason = _dynamic_batching(variant_config, queue_delay_us)
                if reason:
                    result.skipped.append((label, reason))
                    continue
            if doubled:
                _double_instances(variant_config)
            result.variants.append(Variant(backend, kind, variant_config, label))
    return result


def write_repository(variant: Variant, model_dir: Path, root: Path) -> Path:
    """``root/<slug>/<model>/config.pbtxt`` beside links to everything else of the model folder; returns the
    repository folder (``root/<slug>``)."""
    repo = root / variant.slug
    target = repo / model_dir.name
    target.mkdir(parents=True, exist_ok=True)
    for entry in model_dir.iterdir():
        if entry.name in ("config.pbtxt", "configs") or entry.name.startswith("."):
            continue  # the variant's config replaces these
        link = target / entry.name
        if not link.exists() and not link.is_symlink():
            os.symlink(entry.resolve(), link, target_is_directory=entry.is_dir())
    (target / "config.pbtxt").write_text(variant.text(), encoding="utf-8")
    return repo
