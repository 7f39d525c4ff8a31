from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest

from naiad.core.errors import Code, InferError
from naiad.repository.archive import extract_archive


def _file(name: str, data: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    return info, data


def _entry(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = 0o755
    return info, None


def make_archive(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode, format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def refused(archive: Path, target: Path, **limits: int) -> str:
    with pytest.raises(InferError) as raised:
        extract_archive(archive, target, **limits)
    assert raised.value.code == Code.INVALID_ARG
    assert not target.exists(), "the partial target is removed"
    return raised.value.message


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Where an escaping member would land: nothing may appear here."""
    folder = tmp_path / "outside"
    folder.mkdir()
    return folder


def _assert_untouched(outside: Path) -> None:
    assert list(outside.iterdir()) == []


def test_round_trip(tmp_path: Path) -> None:
    archive = make_archive(tmp_path / "model.tar.gz", [
        _entry("./", tarfile.DIRTYPE),
        _entry("add_sub", tarfile.DIRTYPE),
        _file("add_sub/config.pbtxt", b'name: "add_sub"'),
        _file("add_sub/1/model.py", b"print(1)\n" * 1000, mode=0o4755),
        _entry("add_sub/1/alias.py", tarfile.SYMTYPE, "model.py"),
        _entry("add_sub/1/up.py", tarfile.SYMTYPE, "../config.pbtxt"),
        _entry("add_sub/copy.pbtxt", tarfile.LNKTYPE, "add_sub/config.pbtxt"),
    ])
    target = tmp_path / "out" / "model"
    written = extract_archive(archive, target)
    assert written == len(b'name: "add_sub"') + 9000
    assert (target / "add_sub/config.pbtxt").read_bytes() == b'name: "add_sub"'
    assert (target / "add_sub/1/alias.py").read_bytes() == b"print(1)\n" * 1000
    assert (target / "add_sub/1/up.py").read_bytes() == b'name: "add_sub"'
    assert (target / "add_sub/copy.pbtxt").read_bytes() == b'name: "add_sub"'
    assert os.stat(target / "add_sub/1/model.py").st_mode & 0o7777 == 0o755  # setuid dropped


@pytest.mark.parametrize("mode", ["w:gz", "w", "w:bz2", "w:xz"])
def test_found_by_content_not_name(tmp_path: Path, mode: str) -> None:
    archive = make_archive(tmp_path / "model.bin", [_file("m/config.pbtxt", b"abc")], mode)
    assert extract_archive(archive, tmp_path / "out") == 3
    assert (tmp_path / "out/m/config.pbtxt").read_bytes() == b"abc"


def test_an_empty_existing_target_is_fine_a_full_one_is_not(tmp_path: Path) -> None:
    archive = make_archive(tmp_path / "a.tar.gz", [_file("f", b"1")])
    (tmp_path / "empty").mkdir()
    assert extract_archive(archive, tmp_path / "empty") == 1
    with pytest.raises(InferError, match="not empty"):
        extract_archive(archive, tmp_path / "empty")
    assert (tmp_path / "empty/f").read_bytes() == b"1", "a refused target is left as it was"


def test_dot_dot(tmp_path: Path, outside: Path) -> None:
    archive = make_archive(tmp_path / "x.tar.gz", [_file("ok", b"1"), _file("../outside/evil", b"pwned")])
    message = refused(archive, tmp_path / "t")
    assert message == "archive 'x.tar.gz' is not valid: member '../outside/evil' leaves the target folder"
    _assert_untouched(outside)


def test_dot_dot_in_the_middle(tmp_path: Path, outside: Path) -> None:
    archive = make_archive(tmp_path / "x.tar.gz", [_file("a/../../outside/evil")])
    assert "member 'a/../../outside/evil' leaves the target folder" in refused(archive, tmp_path / "t")
    _assert_untouched(outside)


def test_absolute_path(tmp_path: Path, outside: Path) -> None:
    archive = make_archive(tmp_path / "x.tar.gz", [_file(str(outside / "evil"))])
    message = refused(archive, tmp_path / "t")
    assert f"member '{outside / 'evil'}' has an absolute path" in message
    _assert_untouched(outside)


@pytest.mark.parametrize("link", ["../outside", "/etc/passwd", "a/../../outside", "../../../../../../etc"])
def test_symlink_escaping(tmp_path: Path, outside: Path, link: str) -> None:
    archive = make_archive(tmp_path / "x.tar.gz", [_entry("link", tarfile.SYMTYPE, link), _file("link/evil")])
    message = refused(archive, tmp_path / "t")
    assert "member 'link' is a link to" in message, message
    _assert_untouched(outside)


def test_symlink_chain_that_only_escapes_once_a_later_link_exists(tmp_path: Path, outside: Path) -> None:
    """'up' -> 'here/..' is inside while 'here' does not exist, but 'here' -> '.' makes it the parent of the
    target; nothing may be written through it."""
    archive = make_archive(tmp_path / "x.tar.gz", [
        _entry("up", tarfile.SYMTYPE, "here/.."),
        _entry("here", tarfile.SYMTYPE, "."),
        _file("up/outside/evil", b"pwned"),
    ])
    message = refused(archive, tmp_path / "t")
    assert "member 'up/outside/evil' leaves the target folder" in message, message
    _assert_untouched(outside)


def test_symlink_chain_left_behind_is_refused(tmp_path: Path) -> None:
    archive = make_archive(tmp_path / "x.tar.gz", [
        _entry("up", tarfile.SYMTYPE, "here/.."),
        _entry("here", tarfile.SYMTYPE, "."),
    ])
    assert "member 'up' is a link that leaves the target folder" in refused(archive, tmp_path / "t")


def test_a_later_member_replaces_a_link_instead_of_writing_through_it(tmp_path: Path) -> None:
    archive = make_archive(tmp_path / "x.tar.gz", [
        _file("inner", b"original"),
        _entry("keep", tarfile.SYMTYPE, "inner"),
        _file("keep", b"new"),
    ])
    extract_archive(archive, tmp_path / "t")
    assert (tmp_path / "t/inner").read_bytes() == b"original"
    assert not (tmp_path / "t/keep").is_symlink()
    assert (tmp_path / "t/keep").read_bytes() == b"new"


@pytest.mark.parametrize("link", ["../outside/secret", "/etc/passwd", "missing"])
def test_hardlink_escaping(tmp_path: Path, outside: Path, link: str) -> None:
    (outside / "secret").write_text("secret")
    archive = make_archive(tmp_path / "x.tar.gz", [_entry("copy", tarfile.LNKTYPE, link)])
    message = refused(archive, tmp_path / "t")
    assert "member 'copy'" in message, message
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]


def test_hardlink_through_a_symlink_leaving_the_target(tmp_path: Path, outside: Path) -> None:
    (outside / "secret").write_text("secret")
    archive = make_archive(tmp_path / "x.tar.gz", [
        _entry("up", tarfile.SYMTYPE, "here/.."),
        _entry("here", tarfile.SYMTYPE, "."),
        _entry("copy", tarfile.LNKTYPE, "up/outside/secret"),
    ])
    message = refused(archive, tmp_path / "t")
    assert "member 'copy' is a hard link to 'up/outside/secret', which leaves the target folder" in message


@pytest.mark.parametrize("kind", [tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE])
def test_device_and_fifo_members(tmp_path: Path, kind: bytes) -> None:
    archive = make_archive(tmp_path / "x.tar.gz", [_file("ok"), _entry("dev/null", kind)])
    assert "member 'dev/null' is a device or fifo" in refused(archive, tmp_path / "t")


def test_too_many_bytes(tmp_path: Path) -> None:
    archive = make_archive(tmp_path / "x.tar.gz", [_file("a", b"1" * 600), _file("b", b"2" * 600)])
    message = refused(archive, tmp_path / "t", max_bytes=1000)
    assert "member 'b' takes it over the limit of 1000 bytes uncompressed" in message


def test_too_many_bytes_even_when_the_headers_lie(tmp_path: Path) -> None:
    """A GNU long-name record claiming a huge size is read whole by tarfile before it yields any member: the
    decompressed stream itself is bounded."""
    body = io.BytesIO()
    info = tarfile.TarInfo("././@LongLink")
    info.type = tarfile.GNUTYPE_LONGNAME
    info.size = 50 << 20
    body.write(info.tobuf(tarfile.GNU_FORMAT))
    body.write(b"a" * (50 << 20))
    archive = tmp_path / "bomb.tar.gz"
    archive.write_bytes(gzip.compress(body.getvalue(), compresslevel=1))
    message = refused(archive, tmp_path / "t", max_bytes=1000, max_members=10)
    assert "it expands to more than 1000 bytes" in message


def test_too_many_members(tmp_path: Path) -> None:
    archive = make_archive(tmp_path / "x.tar.gz", [_file(f"f{i}") for i in range(6)])
    assert "it holds more than 5 members (at member 'f5')" in refused(archive, tmp_path / "t", max_members=5)


def test_corrupt_and_non_archives(tmp_path: Path) -> None:
    good = make_archive(tmp_path / "good.tar.gz", [_file("m/model.py", os.urandom(100_000))]).read_bytes()
    cases = {
        "text.tar.gz": b"this is not an archive at all, " * 40,
        "empty.tar.gz": b"",
        "truncated.tar.gz": good[: len(good) // 2],
        "flipped.tar.gz": good[:200] + bytes(b ^ 0xFF for b in good[200:400]) + good[400:],
        "garbage.gz": gzip.compress(os.urandom(4096)),
        "noise.tar.bz2": b"BZh9" + os.urandom(500),
        "noise.tar.xz": b"\xfd7zXZ\x00" + os.urandom(500),
        "bad_crc.tar.gz": good[:-8] + bytes(b ^ 0xFF for b in good[-8:]),  # only the stream's end shows it
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        message = refused(tmp_path / name, tmp_path / "t")
        assert message.startswith(f"archive '{name}' is not "), message


def test_missing_archive(tmp_path: Path) -> None:
    with pytest.raises(InferError) as raised:
        extract_archive(tmp_path / "nope.tar.gz", tmp_path / "t")
    assert raised.value.code == Code.NOT_FOUND
    assert not (tmp_path / "t").exists()


def test_label_names_the_archive(tmp_path: Path) -> None:
    archive = make_archive(tmp_path / ".download-123.tar.gz", [_file("../evil")])
    with pytest.raises(InferError, match="archive 'models/a.tar.gz' is not valid: member '../evil'"):
        extract_archive(archive, tmp_path / "t", label="models/a.tar.gz")


def test_archive_size_reads_the_whole_member_list_and_writes_nothing(tmp_path: Path) -> None:
    from naiad.repository import archive as module

    # Past the extraction's first pass (SCAN_BYTES): the sum still counts every member.
    big = 3 * (1 << 20)
    members = [_file("config.pbtxt", b"name: 'm'"), _entry("1", tarfile.DIRTYPE), _file("1/a.bin", bytes(big)),
               _entry("1/link", tarfile.SYMTYPE, "a.bin"), _file("1/b.bin", bytes(big))]
    path = make_archive(tmp_path / "m.tar.gz", members)
    before = set(tmp_path.iterdir())
    original = module.SCAN_BYTES
    module.SCAN_BYTES = 1 << 20
    try:
        assert module.archive_size(path) == 2 * big + len(b"name: 'm'")
    finally:
        module.SCAN_BYTES = original
    assert set(tmp_path.iterdir()) == before
    (tmp_path / "bad.tar.gz").write_bytes(b"not an archive")
    with pytest.raises(InferError) as raised:
        module.archive_size(tmp_path / "bad.tar.gz", label="bad.tar.gz")
    assert raised.value.code == Code.INVALID_ARG and "'bad.tar.gz' is not a valid" in raised.value.message
    with pytest.raises(InferError) as raised:
        module.archive_size(path, max_bytes=big)
    assert "takes it over the limit" in raised.value.message
