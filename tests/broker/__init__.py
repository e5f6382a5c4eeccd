"""Tests of prioqueue.broker (a package, so its conftest has a unique module name)."""
