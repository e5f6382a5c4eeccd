"""The dashboard's web page: static files in the package, served by the broker and the gateway.

The page (``static/index.html``, ``app.js``, ``app.css``) is plain HTML, CSS and JavaScript
(ES modules): no build step, nothing fetched from elsewhere. It polls one JSON endpoint of the
service that served it (``GET /v1/dashboard`` on the broker, ``GET /prioqueue/dashboard`` on
the gateway) every 2 s with the API key the user typed (kept in ``sessionStorage``, sent as
``Authorization: Bearer``), and renders the answer with ``textContent`` only.

:func:`asset` answers the services' static routes; :mod:`prioqueue.ui.model` builds the
parts of the JSON answer both services share.
"""

from __future__ import annotations

from importlib import resources
from typing import Final

__all__ = ["ASSETS", "CSP", "asset"]

ASSETS: Final = {
    "": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
"""The files of the page (``""`` is ``index.html``) and their content types."""

CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""The page's Content-Security-Policy: its own files and its own service, nothing else."""

_SERVICES: Final = {"broker": "/v1/dashboard", "gateway": "/prioqueue/dashboard"}


def asset(name: str, *, service: str, base: str) -> tuple[bytes, str] | None:
    """One file of the page, or None when there is no such file.

    Args:
        name: The path below the page's base (``""`` or ``"index.html"`` for the page).
        service: ``"broker"`` or ``"gateway"`` (the page reads the matching endpoint).
        base: The path the page is served at (``"/ui"``), for its links to ``app.js``.

    Returns:
        ``(body, content type)``.

    Raises:
        ValueError: ``service`` is neither ``"broker"`` nor ``"gateway"``.

    Complexity: O(size of the file).
    """
    if service not in _SERVICES:
        raise ValueError(f"service must be 'broker' or 'gateway', got {service!r}")
    key = "" if name == "index.html" else name
    kind = ASSETS.get(key)
    if kind is None:
        return None
    files = resources.files(__name__).joinpath("static")
    body = files.joinpath(key or "index.html").read_bytes()
    if not key:
        body = (
            body.replace(b"__BASE__", base.encode())
            .replace(b"__SERVICE__", service.encode())
            .replace(b"__ENDPOINT__", _SERVICES[service].encode())
        )
    return body, kind
