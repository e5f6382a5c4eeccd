"""The broker tests' helpers live in ``broker_helpers`` (importable by the test modules)."""

from __future__ import annotations
