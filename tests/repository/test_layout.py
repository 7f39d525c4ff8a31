from __future__ import annotations

from pathlib import Path

import pytest

from naiad.config.loader import parse_config_text
from naiad.repository.layout import select_versions, version_dirs


def test_version_folders_numeric_without_leading_zero(tmp_path: Path) -> None:
    for name in ("1", "2", "10", "01", "abc", "0"):
        (tmp_path / name).mkdir()
    (tmp_path / "3").write_text("a file, not a folder")
    assert list(version_dirs(tmp_path)) == [0, 1, 2, 10]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("", [3]),
        ("version_policy: { latest { num_versions: 2 } }", [2, 3]),
        ("version_policy: { all { } }", [1, 2, 3]),
        ("version_policy: { specific { versions: [1, 3, 7] } }", [1, 3]),
    ],
)
def test_version_policy(policy: str, expected: list[int]) -> None:
    config = parse_config_text(f'name: "m" backend: "python" {policy}')
    assert select_versions(config, [1, 2, 3]) == expected
