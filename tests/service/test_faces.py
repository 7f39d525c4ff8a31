"""The face by concern (``naiad/service/faces.py``): both faces implement every protocol, and front ends depend on
the protocols, never on the in-process class (Ray's local assembly, which builds one, aside)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import naiad
from naiad.service import faces
from naiad.service.face import Service
from naiad.service.remote import RemoteService

ROOT = Path(naiad.__file__).parent
PROTOCOLS = [faces.Inference, faces.Models, faces.SageMaker, faces.Administration]
ASSEMBLERS = {"naiad/ray/local.py"}  # builds an in-process face for a Ray process


def _members(protocol: type) -> set[str]:
    names = {name for name in vars(protocol) if not name.startswith("_")}
    return names | set(getattr(protocol, "__annotations__", {}))


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_both_faces_have_every_member(protocol: type) -> None:
    members = _members(protocol)
    assert members
    for face in (Service, RemoteService):
        missing = {name for name in members if not hasattr(face, name) and name not in _instance_fields(face)}
        assert not missing, f"{face.__name__} lacks {sorted(missing)} of {protocol.__name__}"


def _instance_fields(face: type) -> set[str]:
    """The attributes ``__init__`` sets (``self.x = ...``)."""
    source = ast.parse(Path(__import__(face.__module__, fromlist=["_"]).__file__).read_text())
    fields: set[str] = set()
    for node in ast.walk(source):
        if isinstance(node, ast.ClassDef) and node.name == face.__name__:
            for child in ast.walk(node):
                if isinstance(child, ast.Attribute) and isinstance(child.value, ast.Name) \
                        and child.value.id == "self" and isinstance(child.ctx, ast.Store):
                    fields.add(child.attr)
    return fields


def test_the_protocols_split_the_face_without_overlap() -> None:
    seen: dict[str, str] = {}
    for protocol in PROTOCOLS:
        for name in _members(protocol):
            assert name not in seen, f"{name} is in {seen.get(name)} and {protocol.__name__}"
            seen[name] = protocol.__name__
    assert set(seen) == set().union(*(_members(p) for p in faces.Face.__mro__ if p in PROTOCOLS))
    assert not issubclass(RemoteService, Service)  # the remote face implements the protocols on its own


def test_front_ends_name_protocols_not_the_in_process_class() -> None:
    offenders = []
    for folder in ("frontends", "ray"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = str(path.relative_to(ROOT.parent))
            if relative in ASSEMBLERS:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("naiad.service"):
                    if any(alias.name == "Service" for alias in node.names):
                        offenders.append(relative)
    assert offenders == []
