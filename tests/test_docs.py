"""The README's and docs/'s commands, run: every bash or python block carries a `<!-- docs-test: ... -->` comment
(docs/development.md, "The docs' own test"). `serve` blocks start the server they describe on free ports; `run`
blocks run against it with real clients (tritonclient, curl, boto3 with no credentials but the ones the block
gives) and must print what their comment expects; `skip` blocks name a reason this test checks against the block."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

from tests.server import ROOT, RunningServer

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUNNABLE = {"bash", "sh", "python"}
BLOCK = re.compile(r"^(?:<!-- docs-test: (?P<marker>.*?) -->\n)?```(?P<lang>[a-z]*)\n(?P<body>.*?)^```", re.M | re.S)
# What each skip reason claims of its block, checked: a reason that stops being true fails the test.
REASONS = {
    "pip": re.compile(r"\bpip install\b"),
    "docker": re.compile(r"\bdocker\b"),
    "gpu": re.compile(r"gpu|cuda", re.I),
    "ray": re.compile(r"naiad ray serve|\bray start\b"),
    "slow": re.compile(r"\bnaiad (bench|recommend)\b|\bbenchmarks/"),
    "triton-src": re.compile(r"/tmp/triton-src"),
    "ci": None,  # the block is a line .ci/run runs as it is
    "placeholder": None,  # the quoted names are in the block and name nothing on this machine
}
PORTS = {"8000": "http_port", "8001": "grpc_port", "8002": "metrics_port", "8080": "sagemaker_port"}
PORT_FLAGS = ("--http-port", "--grpc-port", "--metrics-port", "--sagemaker-port")


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    marker: str | None
    body: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    return [Block(page, text.count("\n", 0, m.start("body")), m.group("lang"), m.group("marker"), m.group("body"))
            for m in BLOCK.finditer(text)]


def quoted(text: str) -> list[str]:
    return [a or b for a, b in re.findall(r"\"([^\"]*)\"|'([^']*)'", text)]


def extra_installed(extra: str) -> None:
    """`pip install -e '.[extra]'`: the extra exists in pyproject and what it names is installed here."""
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extra in extras, f"the docs install the extra '{extra}', which pyproject.toml doesn't define"
    for spec in extras[extra]:
        name = re.split(r"[\[<>=;]", spec, maxsplit=1)[0].strip()
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            pytest.skip(f"'{extra}' extra not installed here ({name})")


class DocServer(RunningServer):
    """A documented `naiad serve` line on free ports; one without HTTP is waited on through SageMaker's /ping."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.http_off = "--allow-http=false" in args
        super().__init__([], *args, env=env)

    def _wait(self, ready: bool, any_answer: bool = False, timeout: float = 60.0) -> None:
        if not self.http_off:
            return super()._wait(ready, any_answer, timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"naiad exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if self.sagemaker("GET", "/ping")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"naiad's /ping did not answer 200:\n{self.log()}")


def environment(tmp: Path) -> dict[str, str]:
    """The commands' environment: this checkout's naiad first, no ~/.aws and no AWS keys (boto3 must get the
    block's own), loopback never proxied."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    return {**env, "HOME": str(home), "PYTHONPATH": str(ROOT), "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"}


def serve(block: Block, tmp: Path) -> DocServer:
    text = block.body.replace("\\\n", " ").replace("/tmp/", f"{tmp}/")
    lines = [line for line in text.splitlines() if line.strip()]
    command = [line for line in lines if "naiad serve" in line]
    assert len(command) == 1, f"{block}: a serve block holds one `naiad serve` line"
    setup = lines[:lines.index(command[0])]
    *before, line = command[0].split("&&")
    for part in before:
        found = re.fullmatch(r"\s*pip install -e '\.\[([a-z,]+)\]'\s*", part)
        assert found, f"{block}: only `pip install -e '.[extra]' &&` may come before naiad serve, not {part!r}"
        for extra in found.group(1).split(","):
            extra_installed(extra)
    env = environment(tmp)
    if setup:
        subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(setup)], cwd=ROOT, env=env, check=True,
                       timeout=60)
    words = shlex.split(line, comments=True)
    variables = {}
    while "=" in words[0] and not words[0].startswith("-"):
        name, value = words.pop(0).split("=", 1)
        variables[name] = value
    assert words[:2] == ["naiad", "serve"], f"{block}: {words[:2]}"
    args: list[str] = []
    words = words[2:]
    while words:
        word = words.pop(0)
        if word in PORT_FLAGS:
            words.pop(0)  # the documented port: the test's free one replaces it
        elif not word.startswith(PORT_FLAGS):
            args.append(word)
    if not any(arg.startswith("--exit-on-error") for arg in args):
        args.append("--exit-on-error=true")  # the documented default (RunningServer's tests turn it off)
    return DocServer(args, {**env, **variables})


def run(block: Block, server: DocServer | None, tmp: Path) -> None:
    assert server is not None, f"{block}: a run block needs a serve block before it on its page"
    found = re.fullmatch(r"run expect=(\"(?P<a>.*)\"|'(?P<b>.*)')", block.marker or "")
    assert found, f"{block}: `run expect=\"...\"`, not {block.marker!r}"
    expect = (found.group("a") or found.group("b") or "").replace('\\"', '"')
    text = block.body.replace("/tmp/", f"{tmp}/")
    for port, attribute in PORTS.items():
        text = text.replace(f"localhost:{port}", f"127.0.0.1:{getattr(server, attribute)}")
    command = ["bash", "-euo", "pipefail", "-c", text] if block.lang in ("bash", "sh") else [sys.executable, "-c", text]
    done = subprocess.run(command, cwd=ROOT, env=environment(tmp), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"{block} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert expect in done.stdout, f"{block} did not print {expect!r}:\n{done.stdout}\n{done.stderr}"


def check_skip(block: Block) -> None:
    reason, _, detail = (block.marker or "").removeprefix("skip").strip().partition(" ")
    assert reason in REASONS, f"{block}: skip needs one of {sorted(REASONS)}, not {reason!r}"
    names = quoted(detail)
    assert names and all(names), f"{block}: skip {reason} needs a quoted detail saying why"
    pattern = REASONS[reason]
    if pattern is not None:
        assert pattern.search(block.body), f"{block}: skipped as '{reason}', which the block doesn't show"
    elif reason == "ci":
        ci = (ROOT / ".ci" / "run").read_text().splitlines()
        assert block.body.strip() in ci, f"{block}: .ci/run no longer runs {block.body.strip()!r}"
    else:
        for name in names:
            assert name in block.body, f"{block}: the placeholder {name!r} isn't in the block"
            assert not (name.startswith("/") and Path(name).exists()), f"{block}: {name} exists here: run it"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_command_is_marked(page: Path) -> None:
    for block in blocks(page):
        if block.lang in RUNNABLE:
            assert block.marker, f"{block}: a {block.lang} block needs <!-- docs-test: serve|run|skip ... -->"
            kind = block.marker.split()[0]
            assert kind in ("serve", "run", "skip"), f"{block}: {block.marker!r}"
            if kind == "skip":
                check_skip(block)
        else:
            assert block.marker is None, f"{block}: only bash and python blocks are run"


LIVE = [page for page in PAGES if any((b.marker or "").startswith(("serve", "run")) for b in blocks(page))]


@pytest.mark.parametrize("page", LIVE, ids=lambda page: str(page.relative_to(ROOT)))
def test_the_commands_run(page: Path, tmp_path: Path) -> None:
    server: DocServer | None = None
    try:
        for block in blocks(page):
            kind = (block.marker or "").split(" ")[0]
            if kind == "serve":
                if server is not None:
                    server.stop()
                server = serve(block, tmp_path)
            elif kind == "run":
                run(block, server, tmp_path)
    finally:
        if server is not None:
            server.stop()


def test_a_broken_command_fails(tmp_path: Path) -> None:
    """The runner itself: a command that answers otherwise than documented fails the test."""
    page = ROOT / "README.md"
    live = [b for b in blocks(page) if b.marker and b.marker.startswith(("serve", "run"))]
    server = serve(live[0], tmp_path)
    try:
        curl = next(b for b in live if b.lang == "bash" and b.marker and b.marker.startswith("run"))
        broken = Block(page, curl.line, curl.lang, curl.marker, curl.body.replace("add_sub", "no_such_model"))
        with pytest.raises(AssertionError, match="did not print"):
            run(broken, server, tmp_path)
        failing = Block(page, curl.line, "bash", 'run expect=""', "false\n")
        with pytest.raises(AssertionError, match="exited 1"):
            run(failing, server, tmp_path)
    finally:
        server.stop()


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """What .ci/run does after the docs extra: every page in the nav, every link and anchor found, no warning."""
    pytest.importorskip("mkdocs", reason="the docs extra (pip install -e '.[docs]') is not installed")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "sagemaker" / "index.html").exists()


def test_the_readme_links_lead_somewhere() -> None:
    """mkdocs checks the site's links; the README is outside it, so its own are checked here: files exist, and
    each #anchor is one of its headings (as GitHub makes them)."""
    text = (ROOT / "README.md").read_text()
    headings = {re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
                for line in text.splitlines() if line.startswith("#")}
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    assert len(targets) > 10
    for target in targets:
        if target.startswith(("http://", "https://")):
            continue
        if target.startswith("#"):
            assert target[1:] in headings, f"README links to {target}, which is none of its headings"
        else:
            assert (ROOT / target.split("#")[0]).exists(), f"README links to {target}, which doesn't exist"
