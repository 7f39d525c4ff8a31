"""Version strings read as Triton's gRPC front end reads them (``std::stol``)."""

from __future__ import annotations

import pytest

from naiad.core.errors import Code, InferError
from naiad.frontends.grpc.codec import parse_version


@pytest.mark.parametrize("text, version", [("", ""), ("1", "1"), ("07", "7"), (" 3", "3"), ("2abc", "2"),
                                           ("0", "0"), ("+4", "4")])
def test_versions(text: str, version: str) -> None:
    assert parse_version(text) == version


@pytest.mark.parametrize("text, message", [
    ("x", "failed to get model version from specified version string 'x' (details: stol), version should be an "
          "integral value > 0"),
    ("-2", "invalid model version specified '-2' , version should be an integral value > 0"),
])
def test_bad_versions(text: str, message: str) -> None:
    with pytest.raises(InferError) as info:
        parse_version(text)
    assert (info.value.code, info.value.message) == (Code.INVALID_ARG, message)
