"""The url rules of SageMaker's multi-model API: which urls a load may name, and which folder of the repository
a url names becomes the target model (Triton's sagemaker_server.cc).

A url is ``<models root>/<key>/model[/<subdir>]``. Nothing is loaded through a symbolic link that leads out of
the models root: neither the url itself nor any link inside the folder it names (``link_roots`` names the
folders besides the root that links may lead into: Ray's replicas link repository folders there).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from naiad.config.ensemble import ENSEMBLE_PLATFORM
from naiad.config.loader import load_config
from naiad.core.errors import InferError, invalid
from naiad.repository.layout import model_dirs
from naiad.sagemaker.contract import UrlRefused

_FORBIDDEN = ("/dev/", "/proc/", "/sys/")


def locate(url: str, target: str, models_root: Path, link_roots: list[Path]) -> tuple[Path, str]:
    """The repository to register for ``url`` and the folder in it that becomes the target model: the url
    itself when it holds a config.pbtxt, else its ensemble folder, else its model folder (Triton's rule).
    ``models_root`` is absolute."""
    path = os.path.abspath(os.path.normpath(url)) if url else ""
    if any((path + "/").startswith(prefix) for prefix in _FORBIDDEN):
        raise UrlRefused(f"Invalid URL: {url}. \"url\" property value cannot start with /dev/, /proc/, or /sys/.")
    match = re.fullmatch(rf"({re.escape(str(models_root))}/[0-9A-Za-z._]+)/(model)/?([0-9A-Za-z._]+)?", path)
    if match is None:
        raise invalid(f"Invalid \"url\" '{url}': expected a path of the form "
                      f"{models_root}/<hash>/model[/<subdir>]")
    folder = Path(path)
    _check_links(url, folder, models_root, link_roots)
    if not folder.is_dir():
        raise invalid(f"failed to register '{url}', repository not found")
    if (folder / "config.pbtxt").is_file():
        if match.group(3):
            # Triton registers <root>/<key> and loads its 'model' folder, which isn't this one.
            raise invalid(f"failed to load '{target}', failed to poll from model repository")
        return Path(match.group(1)), match.group(2)
    folders = list(model_dirs(folder))
    ensembles = [name for name in folders if _is_ensemble(folder / name)]
    return folder, (ensembles or folders or [""])[-1]


def _check_links(url: str, folder: Path, models_root: Path, link_roots: list[Path]) -> None:
    """Refuse a url that is, or holds, a symbolic link leading out of the models root (a link inside it
    to another place inside it is fine)."""
    roots = [os.path.realpath(root) for root in (models_root, *link_roots)]

    def check(path: str) -> None:
        real = os.path.realpath(path)
        if not any(real == root or real.startswith(root + os.sep) for root in roots):
            shown = os.path.relpath(path, models_root)
            raise invalid(f"failed to register '{url}': '{shown}' leads to '{real}' through a symbolic link, "
                          f"outside the models root {models_root}; links out of it are not followed")

    check(str(folder))
    for where, folders, files in os.walk(folder):  # links to folders are listed, not entered
        for name in folders + files:
            path = os.path.join(where, name)
            if os.path.islink(path):
                check(path)


def _is_ensemble(folder: Path) -> bool:
    try:
        config, _ = load_config(folder, "")
    except InferError:
        return False
    return config.platform == ENSEMBLE_PLATFORM
