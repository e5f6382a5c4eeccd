"""Tests of prioqueue.gateway (a package, so its conftest has a unique module name)."""
