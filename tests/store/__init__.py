"""Tests of prioqueue.store (a package, so its conftest has a unique module name)."""
