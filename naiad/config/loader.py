"""Read a model's config.pbtxt (or ``configs/<name>.pbtxt``) into a ``ModelConfig`` message."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format

from naiad.config import ModelConfig
from naiad.core.errors import invalid


def config_path(model_dir: Path, config_name: str = "") -> Path | None:
    """Triton prefers ``configs/<config_name>.pbtxt`` when asked for one, then ``config.pbtxt``."""
    if config_name:
        custom = model_dir / "configs" / f"{config_name}.pbtxt"
        if custom.is_file():
            return custom
    default = model_dir / "config.pbtxt"
    return default if default.is_file() else None


def parse_config_text(text: str, source: str = "config.pbtxt") -> ModelConfig:
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise invalid(f"failed to read text proto from {source}: {exc}") from None
    return config


def load_config(model_dir: Path, config_name: str = "") -> tuple[ModelConfig, bool]:
    """The parsed config and whether a file was found (no file means auto-complete must fill it)."""
    path = config_path(model_dir, config_name)
    if path is None:
        return ModelConfig(), False
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise invalid(f"failed to read {path}: {exc}") from None
    return parse_config_text(text, str(path)), True
