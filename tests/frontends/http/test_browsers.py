"""The browser guard of state-changing routes (naiad/frontends/http/browsers.py): which Host names and which
Origin / Content-Type pairs pass. The live routes are exercised in tests/reliability/test_consent.py."""

from __future__ import annotations

import socket

import pytest

from naiad.frontends.http.browsers import BrowserGuard, split_host


@pytest.mark.parametrize("value, parsed", [
    ("127.0.0.1:8000", ("127.0.0.1", "8000")),
    ("LocalHost", ("localhost", "")),
    ("[::1]:8000", ("::1", "8000")),
    ("[::1]", ("::1", "")),
    ("name.example.:80", ("name.example", "80")),
    ("[::1", None),
    ("[::1]x", None),
    ("host:port", None),
])
def test_split_host(value: str, parsed: tuple[str, str] | None) -> None:
    assert split_host(value) == parsed


def _headers(**values: str) -> dict[bytes, bytes]:
    return {name.replace("_", "-").encode(): value.encode() for name, value in values.items()}


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "10.1.2.3", "[::1]:8000", "[fe80::1]", "localhost:8000",
                                  "LOCALHOST", "app.localhost:8000", socket.gethostname(), "models.internal:8000"])
def test_hosts_the_server_answers_to(host: str) -> None:
    assert BrowserGuard(["Models.Internal"]).refusal(_headers(host=host)) is None


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.evil.example", "localhost.evil",
                                  "[::1", "a:b"])
def test_other_names_are_refused(host: str) -> None:
    reason = BrowserGuard().refusal(_headers(host=host))
    assert reason is not None and reason.startswith(f"Host '{host}' is not a name of this server")
    assert "--http-allowed-hosts" in reason
    assert BrowserGuard(["*"]).refusal(_headers(host=host)) is None


def test_no_host_header_is_not_a_browser() -> None:
    assert BrowserGuard().refusal({}) is None


@pytest.mark.parametrize("origin, content_type, refused", [
    ("http://evil.example", "text/plain", True),
    ("http://evil.example", "application/x-www-form-urlencoded", True),
    ("http://evil.example", "multipart/form-data; boundary=x", True),
    ("http://evil.example", None, True),
    ("null", "text/plain", True),  # a sandboxed frame or a file: page
    ("http://127.0.0.1:9000", "text/plain", True),  # another port is another origin
    ("https://127.0.0.1:8000", "text/plain", False),  # the same host and port behind a TLS proxy
    ("http://evil.example", "application/json", False),  # browsers preflight it, and naiad never allows one
    ("http://evil.example", "Application/JSON; charset=utf-8", False),
    ("http://127.0.0.1:8000", "text/plain", False),  # the server's own page
    ("http://127.0.0.1:8000", None, False),
])
def test_cross_site_simple_requests_are_refused(origin: str, content_type: str | None, refused: bool) -> None:
    headers = _headers(host="127.0.0.1:8000", origin=origin)
    if content_type is not None:
        headers[b"content-type"] = content_type.encode()
    reason = BrowserGuard().refusal(headers)
    assert (reason is not None) == refused
    if refused:
        assert reason is not None and reason.startswith(f"cross-origin request refused: Origin '{origin}'")


def test_default_ports_match_an_origin_without_one() -> None:
    guard = BrowserGuard()
    assert guard.refusal(_headers(host="localhost", origin="http://localhost:80", content_type="text/plain")) is None
    assert guard.refusal(_headers(host="localhost:443", origin="https://localhost", content_type="text/plain")) is None
    assert guard.refusal(_headers(host="localhost:80", origin="https://localhost", content_type="text/plain"))
