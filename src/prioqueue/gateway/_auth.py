"""Who is calling: the trusted header, the API keys, the anonymous member (private).

:class:`Callers` is built once from the configuration; :meth:`Callers.identify` answers per
request in O(headers): a trusted header first (when the operator enabled one), then a key
from the ``[keys]`` table, given as llama-swap takes one (``Authorization: Bearer KEY``,
``Authorization: Basic`` with the key as password, as a browser sends it for llama-swap's UI,
or ``X-API-Key: KEY``; schemes in any case), then the anonymous member (when allowed), else
None (the gateway answers 401).
"""

from __future__ import annotations

from prioqueue.gateway.settings import GatewayConfig, Identity, api_key, bearer

__all__ = ["Callers"]


class Callers:
    """The gateway's identities, read from its configuration.

    Args:
        config: The gateway's configuration (``trusted_header``, ``keys``, the anonymous
            member's settings and ``metrics_key``).
    """

    def __init__(self, config: GatewayConfig) -> None:
        self._config = config
        self._anonymous = (
            Identity(
                config.anonymous_member,
                config.anonymous_tier,
                config.anonymous_max_priority,
                observer=config.anonymous_observer,
            )
            if config.allow_anonymous
            else None
        )
        self._keys = {
            key.encode("latin-1"): Identity(
                e.member, e.tier, e.max_priority, observer=e.observer or e.admin, admin=e.admin
            )
            for key, e in config.keys.items()
        }
        self._metrics_key = None if config.metrics_key is None else config.metrics_key.encode()

    def identify(self, headers: list[tuple[bytes, bytes]]) -> Identity | None:
        """Return the caller's identity, or None when it must be refused (401).

        Args:
            headers: The request headers (ASGI, lower-case names).

        Returns:
            The identity: trusted header first (when enabled), then the API key (``Bearer``
            in any case), then the anonymous member (when allowed).
        """
        trusted = self._config.trusted_header
        authorization = x_api_key = None
        if trusted is not None:
            found = {name.decode("latin-1"): value for name, value in headers}
            member = found.get(trusted.member)
            if member:
                tier = trusted.default_tier
                if trusted.tier is not None:
                    named = found.get(trusted.tier, b"").decode("latin-1")
                    if named in self._config.scoring.tier_bonuses:
                        tier = named
                return Identity(member.decode("latin-1"), tier, trusted.max_priority)
            authorization = found.get("authorization")
            x_api_key = found.get("x-api-key")
        else:
            for name, value in headers:
                if name == b"authorization":
                    authorization = value
                elif name == b"x-api-key":
                    x_api_key = value
        for token in (
            None if authorization is None else api_key(authorization),
            None if x_api_key is None else x_api_key.strip(),
        ):
            known = None if token is None else self._keys.get(token)
            if known is not None:
                return known
        return self._anonymous

    def reads_metrics(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """Return whether the request carries the ``metrics_key`` (False when none is set)."""
        if self._metrics_key is None:
            return False
        for name, value in headers:
            if name == b"authorization":
                return bearer(value) == self._metrics_key
        return False
