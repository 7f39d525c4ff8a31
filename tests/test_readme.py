"""The README and docs/ against the server they describe: the defaults they state for `naiad serve`'s flags are
the ones `naiad serve --help` prints, and the test extra the README lists is pyproject's. (tests/test_docs.py runs
their commands.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from functools import cache

import pytest

from tests.server import ROOT

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
UNITS = {"": 1, "s": 1, "ms": 1e-3, "bytes": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 1 << 10, "m": 1 << 20,
         "mib": 1 << 20, "mb": 1 << 20, "g": 1 << 30, "gib": 1 << 30, "gb": 1 << 30, "t": 1 << 40, "tib": 1 << 40}
# A backquoted flag, then its default: "`--flag` 75 s", "`--flag` (256)", "`--flag`, 10000,", "`--flag` (naiad
# only, default 1000, ...)", "`--flag` (64 MiB, as ...)", "`--flag` defaults to false". Nothing else is read as a
# default, so prose around a flag may change freely.
STATED = re.compile(r"`(--[a-z0-9-]+)`,?\s?\(?(?:naiad only,\s)?(?:defaults?\s(?:to\s)?)?"
                    r"(?P<value>true|false|\d+(?:\.\d+)?)(?:\s?(?P<unit>s|ms|bytes|KiB|MiB|GiB|[KMGT])\b)?"
                    r"(?=[\s,;:).]|$)")


@cache
def help_defaults() -> dict[str, str]:
    """Each option of `naiad serve --help` (every spelling) with the default it prints."""
    text = subprocess.run([sys.executable, "-m", "naiad", "serve", "--help"], capture_output=True, text=True,
                          check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}).stdout
    entries = re.split(r"\n(?=  -)", text.split("\noptions:\n", 1)[1])
    defaults: dict[str, str] = {}
    for entry in entries:
        joined = " ".join(entry.split())
        found = re.search(r"\(default: (.*?)\)$", joined)
        if found is None:
            continue
        invocation = joined.split("  ")[0] if "  " in joined else joined
        for flag in re.findall(r"(?:^|, )(--[a-z0-9-]+)", invocation):
            defaults[flag] = found.group(1)
    return defaults


def readme_prose() -> str:
    """The README and the docs without their code blocks (commands there set values, they don't state defaults)."""
    return "\n".join(re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL) for page in PAGES)


def number(value: str, unit: str | None = None) -> float | bool | None:
    """A stated or printed default as a comparable value: booleans, or numbers in bytes or seconds."""
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    found = re.fullmatch(r"(\d+(?:\.\d+)?) ?([A-Za-z]*)", value.strip())
    if found is None:
        return None
    scale = UNITS.get((unit or found.group(2)).lower())
    return None if scale is None else float(found.group(1)) * scale


def test_the_help_is_parsed() -> None:
    defaults = help_defaults()
    assert defaults["--http-keepalive-timeout"] == "75.0"
    assert defaults["--model-store"] == defaults["--model-repository"]  # (an alias shares its entry)
    assert len(defaults) > 100


def test_the_defaults_the_readme_states_are_the_servers() -> None:
    defaults = help_defaults()
    checked, wrong = [], []
    for match in STATED.finditer(readme_prose()):
        flag, value, unit = match.group(1), match.group("value"), match.group("unit")
        if flag not in defaults:
            continue  # another command's flag (bench, recommend, ray)
        stated, printed = number(value, unit), number(defaults[flag])
        if printed is None:
            continue
        checked.append(flag)
        if stated != printed:
            wrong.append(f"{match.group(0)!r}: --help says {defaults[flag]}")
    assert not wrong, "\n".join(wrong)
    # The pages state a few dozen defaults; far fewer found means the pattern no longer reads them.
    assert len(set(checked)) >= 25, sorted(set(checked))
    for flag in ("--http-keepalive-timeout", "--http-max-input-size", "--exit-on-error", "--grpc-max-connections"):
        assert flag in checked


def test_what_get_v2_names_the_server() -> None:
    prose = readme_prose()
    named = re.findall(r"names the server in `GET /v2` \(`([^`]+)`", prose)
    named += re.findall(r"`GET /v2` names the server `([^`]+)`", prose)
    assert named, "neither the README nor docs/ says what GET /v2 names the server any more"
    assert set(named) == {help_defaults()["--id"]}


def test_the_test_extra_is_the_one_listed() -> None:
    """Every package of `pip install -e '.[test]'` is named where the README lists what it installs."""
    tomllib = pytest.importorskip("tomllib")  # (Python 3.11+)
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    section = README.read_text().split("## Run the tests", 1)[1].split("\n## ", 1)[0].lower()
    missing = [spec for spec in extra
               if re.split(r"[\[<>=;]", spec, maxsplit=1)[0].strip().lower() not in section]
    assert not missing, f"pyproject's test extra has {missing}, which the README's 'Run the tests' doesn't name"


def test_the_readme_examples_make_the_folders_they_serve() -> None:
    """A command that serves /tmp/<folder> creates it first: `naiad serve` refuses a repository that doesn't exist."""
    blocks = [block for page in PAGES for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.DOTALL)]
    assert any("--model-repository /tmp/" in block for block in blocks)  # (the check still finds what it checks)
    for block in blocks:
        command = block.replace("\\\n", " ")
        for folder in re.findall(r"--model-repository (/tmp/\S+)", command):
            assert re.search(rf"mkdir -p [^\n]*{re.escape(folder)}(\s|$)", command), command


def test_the_fast_subset_the_readme_gives() -> None:
    """`-m "not slow"` as the README says: the marker exists, and each path conftest marks slow still exists."""
    from tests.conftest import SLOW

    assert 'python -m pytest -q -m "not slow"' in README.read_text()
    for path in SLOW:
        assert (ROOT / path).exists(), f"tests/conftest.py marks {path} slow, which no longer exists"
