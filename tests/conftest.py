"""Settings shared by every test module.

Hypothesis's per-example ``deadline`` (200 ms by default) is a timing assertion: on a busy
machine (CI beside other jobs, ``nox`` beside a CPU burner) a slow example fails a test whose
behaviour is right. Speed is measured in ``nox -s bench``, not in tests, so the profile below
turns the deadline off and, for the same reason, the ``too_slow`` health check of data
generation; every other check stays.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile("prioqueue", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("prioqueue")
