from __future__ import annotations

from pathlib import Path

import pytest

from naiad.config.loader import parse_config_text
from naiad.repository.layout import model_dir, model_dirs, select_versions, version_dirs


def test_version_folders_numeric_without_leading_zero(tmp_path: Path) -> None:
    for name in ("1", "2", "10", "01", "abc", "0"):
        (tmp_path / name).mkdir()
    (tmp_path / "3").write_text("a file, not a folder")
    assert list(version_dirs(tmp_path)) == [0, 1, 2, 10]


def test_one_model_folder_found_as_the_listing_finds_it(tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    for name in ("m0", "m 1", ".hidden", "m0/1"):
        (repository / name).mkdir(parents=True)
    (repository / "a_file").write_text("not a model")
    (tmp_path / "outside").mkdir()
    (repository / "linked").symlink_to(tmp_path / "outside", target_is_directory=True)
    listed = model_dirs(repository)
    assert sorted(listed) == ["linked", "m 1", "m0"]
    for name in [*listed, ".hidden", "a_file", "m0/1", "../outside", ".", "..", "", "missing", "m\x00"]:
        assert model_dir(repository, name) == listed.get(name), name
    assert model_dir(tmp_path / "no-such-repository", "m0") is None


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
