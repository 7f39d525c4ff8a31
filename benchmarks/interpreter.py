"""Which interpreter a benchmark ran naiad on: its build moves naiad's CPU per request by 6-24 % (pyenv's default
build against a PGO and LTO one: docs/benchmarks/big-tensors.md, "The interpreter: like for like"), so every table
should say."""

from __future__ import annotations

import shlex
import shutil
import subprocess

_PROBE = ("import sys, sysconfig; config = sysconfig.get_config_var('CONFIG_ARGS') or ''; "
          "linked = 'libpython' in open('/proc/self/maps').read(); "
          "flags = [f for f in ('--enable-optimizations', '--with-lto') if f in config]; "
          "print('|'.join([sys.version.split()[0], 'libpython shared' if linked else 'libpython built in', *flags]))")


def describe(python: str) -> str:
    """The interpreter's path, version and build. A distribution's build (Debian's) doesn't list its PGO and LTO
    flags; a source build (pyenv's, python:3.11-slim's) does."""
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{python} (not described: {exc})"
    return f"{python} ({out.stdout.strip().replace('|', ', ')})"


def describe_command(command: str) -> str:
    """The interpreter of a ``python -m naiad serve``-style command line (its first word, found on PATH)."""
    first = shlex.split(command)[0] if command.strip() else ""
    found = shutil.which(first) if first else None
    return describe(found) if found else f"{first or command!r} (not found on PATH)"
