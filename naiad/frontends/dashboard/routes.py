"""``GET /dashboard``: the page and its script and style, and ``GET /dashboard/feed``, the JSON it polls.

Served on the HTTP port, or on the SageMaker port when HTTP is off (``--allow-dashboard``, on by default).

Restricted APIs: the feed belongs to every category whose data it shows: ``health`` (live, ready), ``metadata``
(server name and version, each model's platform), ``model-config`` (instances), ``model-repository`` (the index,
states, failure reasons, residency; the page's buttons call the repository extension) and ``statistics``. When
``--http-restricted-api`` restricts any of them, the feed answers Triton's 403 unless the request carries each of
their headers; the page (static files holding no data) then asks for each header's value and sends it with every
request it makes, the load and unload calls included. A browser cannot add a header to a page it navigates to,
hence the page itself is served to anyone; without the key it shows nothing but the prompt.
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson

from naiad.core.restricted import Restrictions
from naiad.frontends.replies import JSON, Deferred, Reply, later
from naiad.frontends.replies import method_not_allowed as _method_not_allowed
from naiad.service import Administration

# The restricted-API categories whose data the feed shows (naiad/core/restricted.py): the feed is fenced by each.
CATEGORIES = ("health", "metadata", "model-config", "model-repository", "statistics")
FEED = "/dashboard/feed"
FRESH_S = 0.5  # pages polling within this of each other share one build of the feed

STATIC = Path(__file__).resolve().parent / "static"
_FILES = {
    "/dashboard": ("index.html", b"text/html; charset=utf-8"),
    "/dashboard/app.js": ("app.js", b"text/javascript; charset=utf-8"),
    "/dashboard/style.css": ("style.css", b"text/css; charset=utf-8"),
}
_PAGE_HEADERS = [
    (b"Cache-Control", b"no-cache"),
    (b"X-Content-Type-Options", b"nosniff"),
    # Everything comes from naiad itself (no CDN, no inline script); nobody may frame the buttons.
    (b"Content-Security-Policy", b"default-src 'self'; frame-ancestors 'none'"),
]
_FEED_HEADERS = [(b"Cache-Control", b"no-store"), (b"X-Content-Type-Options", b"nosniff")]
# /dashboard/ -> /dashboard, by a relative Location: right behind a proxy that serves naiad under a prefix too.
_TO_PAGE = Reply(301, b"", b"text/plain", [(b"Location", b"../dashboard"), (b"Cache-Control", b"no-cache")])


class Dashboard:
    def __init__(self, service: Administration, restricted: Restrictions, port: str = "http") -> None:
        self.service = service
        self.port = port
        # (lower-cased header name, value, refusal) for each restricted category the feed falls under.
        self.rules = []
        for category in CATEGORIES:
            rule = restricted.rule(category)
            if rule is not None:
                refusal = Reply(403, orjson.dumps({"error": restricted.refusal(category)}), JSON, _FEED_HEADERS)
                self.rules.append((rule[0].lower().encode("latin-1"), rule[1].encode("latin-1"), refusal))
        self.files = {path: Reply(200, (STATIC / name).read_bytes(), content_type, _PAGE_HEADERS)
                      for path, (name, content_type) in _FILES.items()}
        self._built = 0.0
        self._feed = b""

    def handle(self, method: bytes, path: str, headers: dict[bytes, bytes]) -> Reply | Deferred | None:
        """The reply for a dashboard path; None for any other path (the port's own 404 / 400 then)."""
        if path == FEED:
            if method not in (b"GET", b"HEAD"):
                return _method_not_allowed()
            for key, value, refusal in self.rules:
                if headers.get(key) != value:
                    return refusal
            if time.monotonic() - self._built < FRESH_S:
                return Reply(200, self._feed, JSON, _FEED_HEADERS)
            return later(self._fresh())
        page = self.files.get(path)
        if page is None:
            if path == "/dashboard/":
                page = _TO_PAGE  # its files are relative to /dashboard, not to /dashboard/
            else:
                return None
        if method not in (b"GET", b"HEAD"):
            return _method_not_allowed()
        return page

    async def _fresh(self) -> Reply:
        # Asking for the feed also keeps the per-second sampling on.
        self._feed = orjson.dumps(await self.service.dashboard_feed(self.port))
        self._built = time.monotonic()
        return Reply(200, self._feed, JSON, _FEED_HEADERS)

