#!/usr/bin/env bash
# Stand-in for Docker Hub's python:3.11-slim, built from Debian's own packages, for machines that reach
# deb.debian.org and PyPI but not Docker Hub (CI here). The Dockerfile's FROM then resolves locally and the
# Dockerfile itself stays the one users build against the real image.
#
#   tools/container/base_image.sh            # idempotent: does nothing when the tag already exists
#
# Cached twice: the image itself (reused whenever the tag exists, including a real python:3.11-slim pulled
# from Docker Hub) and the root's tarball under $NAIAD_BASE_CACHE, so a daemon whose data was wiped
# re-imports in seconds instead of re-running debootstrap (~1 min).
#
# What differs from the official image, and why it doesn't matter to the Dockerfile:
#   - Python is Debian's 3.11.2 in /usr/bin, not a source build in /usr/local; `python`, `python3`, `pip` and
#     `pip3` are all on PATH as there, and pip installs as root into /usr/local (Debian's posix_local scheme).
#   - Debian marks its Python EXTERNALLY-MANAGED (PEP 668); the official image doesn't, so the marker is removed
#     and the Dockerfile's plain `pip install` works unchanged.
#   - pip is Debian's 23.0.1 (python3-pip), with Debian's setuptools/wheel beside it.
#   - The host's local CAs (/usr/local/share/ca-certificates, or $NAIAD_BASE_EXTRA_CA) are trusted inside too:
#     where egress goes through a TLS-inspecting proxy, pip in `docker build` fails certificate checks without
#     them, and this image only ever exists on the host that built it.
set -euo pipefail
trap 'echo "base_image.sh: failed at line $LINENO" >&2' ERR

TAG=python:3.11-slim
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${NAIAD_BASE_CACHE:-/var/cache/naiad/base}
TARBALL=$CACHE/python3.11-slim-$SUITE.tar
ROOT_DIR=$(cd "$(dirname "$0")/../.." && pwd)

# The tag must be what the Dockerfile builds FROM, or this script builds an image nobody uses.
if ! grep -Eq "^FROM $TAG( |$)" "$ROOT_DIR/Dockerfile"; then
    echo "base_image.sh: the Dockerfile no longer builds FROM $TAG; update this script with it" >&2
    exit 2
fi

if docker image inspect "$TAG" >/dev/null 2>&1; then
    echo "base_image.sh: $TAG present, reused"
    exit 0
fi

if [ ! -s "$TARBALL" ]; then
    command -v debootstrap >/dev/null || { echo "base_image.sh: debootstrap is not installed" >&2; exit 3; }
    mkdir -p "$CACHE"
    work=$(mktemp -d "$CACHE/root.XXXXXX")
    trap 'umount "$work/root/proc" 2>/dev/null || true; rm -rf "$work"' EXIT
    echo "base_image.sh: debootstrap $SUITE from $MIRROR (about a minute)"
    # python3-pip rather than ensurepip: Debian disables ensurepip for its system Python.
    debootstrap --variant=minbase --include=python3.11,python3-pip,python3-venv,ca-certificates \
        "$SUITE" "$work/root" "$MIRROR" > "$work/debootstrap.log" 2>&1 \
        || { tail -20 "$work/debootstrap.log" >&2; exit 4; }
    root=$work/root
    rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
    extra_ca=${NAIAD_BASE_EXTRA_CA:-/usr/local/share/ca-certificates}
    if compgen -G "$extra_ca/*.crt" >/dev/null; then
        cp "$extra_ca"/*.crt "$root/usr/local/share/ca-certificates/"
        chroot "$root" update-ca-certificates >/dev/null 2>&1
        echo "base_image.sh: trusting the host's CAs from $extra_ca"
    fi
    ln -sf /usr/bin/python3 "$root/usr/local/bin/python"
    # What the slim image leaves out too: package lists and caches, docs, man pages, translations.
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/log/* \
        "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/*
    find "$root" -name __pycache__ -type d -prune -exec rm -rf {} +
    # The daemon fills these in for each container; debootstrap left the build host's copies.
    : > "$root/etc/resolv.conf"
    : > "$root/etc/hostname"
    tar --numeric-owner -C "$root" -cf "$TARBALL.tmp" .
    mv "$TARBALL.tmp" "$TARBALL"
fi

# awk reads to the end: exiting early would kill tar with SIGPIPE, and pipefail would end the script there.
version=$(tar -xOf "$TARBALL" ./var/lib/dpkg/status \
    | awk '/^Package: python3.11$/ {p = 1} p && /^Version:/ && !done {print $2; done = 1}')
docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change "ENV PYTHON_VERSION=${version%%-*}" \
    --change 'CMD ["python3"]' \
    --message "Debian $SUITE python3.11 $version (debootstrap), standing in for Docker Hub's $TAG" \
    "$TARBALL" "$TAG" >/dev/null
echo "base_image.sh: imported $TAG (Debian python3.11 $version)"
