"""The public face: the export list, the version, and the core's independence from adapters."""

from __future__ import annotations

import subprocess
import sys

import pytest

import prioqueue
from prioqueue.cli import main

EXPECTED = {
    "BATCH",
    "DEFAULT_ALIASES",
    "DEFAULT_CALCULATOR",
    "DEFAULT_RETRY_AFTER",
    "DEFAULT_TIER_BONUSES",
    "DEFAULT_WAIT_BUCKETS",
    "FLAT_WORK_SAMPLERS",
    "HEADER",
    "INTERACTIVE",
    "MAX_HEADER_LENGTH",
    "NORMAL",
    "REORDER_CAUSES",
    "SAMPLER_UNITS",
    "SLOW_BASELINE_MULTIPLIERS",
    "AheadJob",
    "Backoff",
    "CancelRunning",
    "Chain",
    "ChainProgress",
    "ChainState",
    "ChainStep",
    "ChargeError",
    "ChargeModel",
    "Completed",
    "ConfigError",
    "DuplicateJob",
    "Expired",
    "Explanation",
    "FailurePolicy",
    "FleetDispatcher",
    "Grant",
    "GroupState",
    "GroupStatus",
    "ImageRequest",
    "InvalidState",
    "Job",
    "JobState",
    "Lease",
    "LeaseCalculator",
    "LeaseError",
    "LeaseExpired",
    "LeaseExplanation",
    "LevelBudget",
    "LevelStats",
    "MemberStats",
    "Overloaded",
    "Overtake",
    "OvertakeCause",
    "PrioqueueError",
    "PriorityPolicy",
    "QueueFull",
    "Reorders",
    "ScoreBreakdown",
    "Scorer",
    "ScoringConfig",
    "SizeOneDispatcher",
    "Stats",
    "Ticket",
    "UnknownGroup",
    "UnknownJob",
    "UnknownWorker",
    "WorkerInfo",
    "explain_lease",
    "lease_seconds",
    "parse_priority",
    "sampler_work",
}


def test_export_list_is_exactly_the_public_api() -> None:
    # An accidental rename or removal of a public name fails here.
    assert set(prioqueue.__all__) == EXPECTED
    for name in prioqueue.__all__:
        assert getattr(prioqueue, name) is not None


def test_version_comes_from_the_distribution() -> None:
    assert prioqueue.__version__ == "0.1.0"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = prioqueue.nope


def test_every_exception_is_a_prioqueue_error() -> None:
    for name in (
        "ChargeError",
        "ConfigError",
        "DuplicateJob",
        "InvalidState",
        "LeaseExpired",
        "QueueFull",
        "UnknownWorker",
    ):
        assert issubclass(getattr(prioqueue, name), prioqueue.PrioqueueError)
    assert issubclass(prioqueue.ChargeError, ValueError)
    assert prioqueue.ChargeError("bad", job_id="j").job_id == "j"
    assert issubclass(prioqueue.UnknownWorker, LookupError)
    assert str(prioqueue.UnknownWorker("worker 'w' has not joined")) == "worker 'w' has not joined"
    assert issubclass(prioqueue.UnknownJob, LookupError)
    assert str(prioqueue.UnknownJob("job 'x' is not queued")) == "job 'x' is not queued"
    assert str(prioqueue.UnknownJob()) == "unknown job"


def test_the_core_imports_no_adapter_and_no_optional_dependency() -> None:
    code = (
        "import sys, prioqueue, prioqueue.dispatcher, prioqueue.fleet, prioqueue.testing;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'httpx', 'uvicorn', 'rich', 'prometheus_client', 'matplotlib', 'asyncio'} "
        "or m.startswith(('prioqueue.gateway', 'prioqueue.sim', 'prioqueue.prometheus', "
        "'prioqueue.asyncio')));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_cli_version_and_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == "prioqueue-lanes 0.1.0"
    assert main([]) == 2
    assert "simulate" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "imported", "not_imported"),
    [
        (["jobs", "--help"], "prioqueue.client.jobs_cli", "fastapi"),
        (["--help"], None, "prioqueue.client"),
        (["--version", "simulate", "--help"], "prioqueue.sim.cli", "prioqueue.broker"),
    ],
)
def test_the_cli_imports_only_the_subcommand_it_runs(
    argv: list[str], imported: str | None, not_imported: str
) -> None:
    # A ``prioqueue jobs`` process must not pay for the broker's web stack (issue 29: every
    # subprocess test spent ~0.7 s, seconds under load, importing every adapter).
    code = (
        "import sys\nfrom prioqueue.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        f"print({imported!r} is None or {imported!r} in sys.modules, "
        f"{not_imported!r} in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "True False", result.stdout
