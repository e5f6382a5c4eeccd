"""The broker's store checks (issue 21, Lows): ``--check``, tampered journal rows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from prioqueue.cli import main
from prioqueue.store import CorruptStore, Event, open_store

from .broker_helpers import SUBMITTER, run
from .test_broker_throughput import served


def _config(tmp_path: Path, store: str) -> Path:
    path = tmp_path / "broker.toml"
    path.write_text(f'listen = "127.0.0.1:0"\nstore = "{store}"\n', encoding="utf-8")
    return path


def test_check_refuses_an_sqlite_path_in_a_missing_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config(tmp_path, f"sqlite:///{tmp_path / 'missing' / 'b.db'}")
    assert main(["broker", "--config", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert "missing does not exist" in err
    assert not (tmp_path / "missing").exists()
    good = _config(tmp_path, f"sqlite:///{tmp_path / 'b.db'}")
    assert main(["broker", "--config", str(good), "--check"]) == 0
    assert not (tmp_path / "b.db").exists()  # --check touches nothing


# Runs the CLI where psycopg cannot be found (a meta-path finder hides it): the environment
# of a user who did not install the postgres extra, not a mock of the store.
_NO_PSYCOPG = """
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name == "psycopg" or name.startswith("psycopg."):
            raise ModuleNotFoundError(name)
        return None
sys.meta_path.insert(0, Hide())
from prioqueue.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_check_refuses_postgresql_without_psycopg(tmp_path: Path) -> None:
    path = _config(tmp_path, "postgresql://postgres@127.0.0.1:5432/test")
    proc = subprocess.run(
        [sys.executable, "-c", _NO_PSYCOPG, "broker", "--config", str(path), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "needs psycopg" in proc.stderr


def test_check_accepts_postgresql_with_psycopg(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("psycopg")
    path = _config(tmp_path, "postgresql://postgres@127.0.0.1:5432/test")
    assert main(["broker", "--config", str(path), "--check"]) == 0
    assert "configuration OK" in capsys.readouterr().out


def _journal_with(db: Path, **changes: object) -> None:
    """A store whose journal holds one submit, as the broker writes it, edited by hand."""
    store = open_store(f"sqlite:///{db}")
    epoch = store.claim()
    args = {
        "now": 1000.0, "member": "alice", "tier": "pro", "priority": 0, "model": "m",
        "estimate": None, "group": "g", "image": None, "payload": {"p": 1},
        "idempotency_key": None,
    }  # fmt: skip
    args.update(changes)
    store.append([Event(seq=1, op="submit", args=args, now=1000.0)], epoch=epoch)
    store.close()


def test_an_untouched_journal_row_replays_and_reads(tmp_path: Path) -> None:
    _journal_with(tmp_path / "b.db")

    async def restart() -> None:
        async with served(f"sqlite:///{tmp_path / 'b.db'}") as (client, _broker):
            r = await client.get("/v1/jobs/job-1", headers=SUBMITTER)
            assert (r.status_code, r.json()["model"]) == (200, "m")

    run(restart())


@pytest.mark.parametrize(
    ("field", "value"),
    [("model", 5), ("priority", "high"), ("group", ["g"]), ("estimate", True), ("member", 7)],
)
def test_a_tampered_journal_row_is_refused_at_replay(
    tmp_path: Path, field: str, value: object
) -> None:
    # Before issue 21 such a row replayed, and its GET answered 500 (a record the API
    # cannot render); now recovery stops and names the event and the field.
    _journal_with(tmp_path / "b.db", **{field: value})

    async def restart() -> None:
        async with served(f"sqlite:///{tmp_path / 'b.db'}"):  # pragma: no cover - no start
            raise AssertionError("the broker started on a tampered journal")

    with pytest.raises(CorruptStore, match=rf"event 1 \(submit\) does not replay: .*{field}"):
        run(restart())
