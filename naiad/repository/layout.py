"""What a repository folder holds: model folders and their numeric version folders."""

from __future__ import annotations

from pathlib import Path

from naiad.config import ModelConfig


def model_dirs(repository: Path) -> dict[str, Path]:
    """Every sub-folder is a model; hidden folders are not."""
    if not repository.is_dir():
        return {}
    return {p.name: p for p in sorted(repository.iterdir()) if p.is_dir() and not p.name.startswith(".")}


def model_dir(repository: Path, name: str) -> Path | None:
    """The folder of model ``name`` as ``model_dirs`` lists it, found with one stat rather than a listing."""
    if not name or name.startswith(".") or "/" in name:  # a sub-folder's own name: one path component, not hidden
        return None
    folder = repository / name
    return folder if folder.is_dir() else None


def version_dirs(model_dir: Path) -> dict[int, Path]:
    """Numeric folders only; Triton ignores names like ``abc`` and ``01`` (leading zeros)."""
    found: dict[int, Path] = {}
    for p in model_dir.iterdir():
        name = p.name
        if p.is_dir() and name.isdigit() and (name == "0" or not name.startswith("0")):
            found[int(name)] = p
    return dict(sorted(found.items()))


def select_versions(config: ModelConfig, available: list[int]) -> list[int]:
    """Apply ``version_policy``: latest{num_versions} (default 1), all, or specific."""
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return sorted(available)
    if choice == "specific":
        wanted = set(policy.specific.versions)
        return sorted(v for v in available if v in wanted)
    count = policy.latest.num_versions if choice == "latest" else 1
    return sorted(available)[-max(count, 1):] if available else []
