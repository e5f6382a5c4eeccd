"""The gateway tests' fixtures live in ``gateway_helpers`` (importable by the test modules)."""

from __future__ import annotations

from .gateway_helpers import make_stack

__all__ = ["make_stack"]
