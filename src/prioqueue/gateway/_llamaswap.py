"""What llama-swap sends that the gateway reads: its loading state, its error reasons.

:class:`LoadingState` tells llama-swap's loading chunks (``sendLoadingState: true``) from the
model's own stream; :func:`upstream_reason` takes one line of reason from an error body. Both
follow the real llama-swap (``internal/router/loading.go``, ``internal/swaputil/http.go``),
checked against the binary in ``tests/gateway/real``.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["LoadingState", "upstream_reason"]

_LOADING_MARK = "\u2501\u2501\u2501\u2501\u2501"
"""The first loading chunk llama-swap sends (``sendLoadingState``): a rule of five U+2501."""


class LoadingState:
    """Tells llama-swap's loading chunks (``sendLoadingState: true``) from the model's answer.

    For a streamed chat completion that needs a cold load, llama-swap answers at once (200,
    ``text/event-stream``) and streams the load's progress as events of the one shape
    ``data: {"choices":[{"delta":{"reasoning_content":TEXT}}]}`` (no ``id``, no ``object``),
    the first one's TEXT a rule of five U+2501 characters; the model's own chunks follow.
    :meth:`feed` reads the response's chunks: while it returns False the load goes on (the
    time to first byte and ``first_byte_timeout`` run on); it returns True from the first
    chunk that holds anything else. A stream whose first event is not the mark is the
    model's from its first byte. O(bytes) while loading, O(1) after.
    """

    __slots__ = ("_buffer", "loading", "over")

    def __init__(self) -> None:
        self._buffer = b""
        self.loading = False
        """Whether llama-swap's loading chunks were seen."""
        self.over = False
        """Whether the model's own answer began (or the stream is not a loading stream)."""

    def feed(self, chunk: bytes) -> bool:
        """Read one chunk of the stream; return whether the model's answer has begun."""
        if self.over:
            return True
        self._buffer += chunk
        while b"\n\n" in self._buffer:
            event, _, self._buffer = self._buffer.partition(b"\n\n")
            text = _loading_text(event)
            if text is None or (not self.loading and text != _LOADING_MARK):
                self.over = True
                return True
            self.loading = True
        if len(self._buffer) > 65536:  # no loading event is that long
            self.over = True
        return self.over


def _loading_text(event: bytes) -> str | None:
    """The TEXT of one llama-swap loading event, or None when the event is anything else."""
    if not event.startswith(b"data: "):
        return None
    try:
        value = json.loads(event[6:])
    except ValueError:
        return None
    if not isinstance(value, dict) or list(value) != ["choices"]:
        return None
    choices = value["choices"]
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    delta = choices[0].get("delta")
    if list(choices[0]) != ["delta"] or not isinstance(delta, dict):
        return None
    text = delta.get("reasoning_content")
    return text if list(delta) == ["reasoning_content"] and isinstance(text, str) else None


def upstream_reason(body: bytes, limit: int = 300) -> str:
    """One line saying why an upstream failed, from its error body (JSON or text). O(len)."""
    text = body.decode("utf-8", "replace")
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    found: Any = value
    for key in ("error", "message"):
        if isinstance(found, dict) and key in found:
            found = found[key]
    if isinstance(found, dict) and isinstance(found.get("message"), str):
        found = found["message"]
    if isinstance(found, str):
        text = found
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
