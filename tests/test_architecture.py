"""The layout rules of issue 20, asserted (``python tests/architecture.py`` prints the graph)."""

from __future__ import annotations

import ast

import architecture


def test_import_graph_has_no_circles() -> None:
    assert architecture.circles(architecture.import_graph()) == []


def test_no_module_imports_another_packages_private_module() -> None:
    assert architecture.private_imports(architecture.import_graph()) == []


def test_only_the_core_and_its_facades_import_the_core() -> None:
    # Issue 29, item 1: the dispatchers' state never leaves them (state_of is gone); a
    # planted import is found.
    graph = architecture.import_graph()
    assert architecture.core_imports(graph) == []
    assert architecture.core_imports(
        {"prioqueue.ui.model": {"prioqueue._core.facade"}, "prioqueue.fleet": {"prioqueue._core"}}
    ) == ["prioqueue.ui.model -> prioqueue._core.facade"]


def test_modules_are_short() -> None:
    assert architecture.long_modules() == []


def test_only_a_declared_module_passes_the_gauge() -> None:
    plain = '"""A module."""\n'
    declared = f'"""A module.\n\nIt is {architecture.ONE_THING}: why.\n"""\n'
    assert not architecture.declared_one_thing(plain)
    assert architecture.declared_one_thing(declared)
    folded = declared.replace("past the 500-line", "past the\n500-line")
    assert architecture.declared_one_thing(folded)  # the sentence may wrap


def test_functions_are_short() -> None:
    assert architecture.long_functions() == []


def test_the_graph_sees_every_kind_of_import() -> None:
    # A check that finds nothing must still be able to find something: the graph holds
    # imports made under TYPE_CHECKING and inside functions (the store imports the
    # dispatchers only where it needs them), and the circle finder finds a planted circle.
    graph = architecture.import_graph()
    assert "prioqueue._journaled" in graph["prioqueue.dispatcher"]
    planted = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert architecture.circles(planted) == [["a", "b", "c"]]
    assert architecture.private_imports(
        {"prioqueue.broker.cli": {"prioqueue.gateway._server"}}
    ) == ["prioqueue.broker.cli -> prioqueue.gateway._server"]


def test_every_module_assigns_only_what_it_owns() -> None:
    # Issue 29: no attribute assignment on an object other than self/cls outside the module
    # that defines its class, in every module under src (the core and its structures, the
    # facades, the driver, the adapters, the reference model; any module added later too).
    assert architecture.foreign_assignments() == []


def test_nothing_reaches_into_another_modules_private_fields() -> None:
    assert architecture.private_reaches() == []
    assert architecture.private_reaches(into="prioqueue._driver") == []


def test_the_ownership_checks_find_planted_breaches() -> None:
    owner = ast.parse(
        "class Waiter:\n"
        "    __slots__ = ('grant', '_timer')\n"
        "class Driver:\n"
        "    def __init__(self):\n"
        "        self._waiters = {}\n"
        "    def hand(self, waiter, grant):\n"
        "        waiter.grant = grant\n"
        "        waiter._timer = None\n"
        "        self._waiters[grant] = waiter\n"
    )
    user = ast.parse(
        "def requeue(gate, turn):\n"
        "    turn.grant = None\n"
        "    del turn.note\n"
        "    turn.state.count += 1\n"
        "    gate._waiters.pop(turn.job_id)\n"
        "    gate._release(turn)\n"
        "    response.status_code = 200\n"
        "    os._exit(75)\n"
        "    return type(gate).__name__\n"
    )
    trees = {"pkg._driver": owner, "pkg.user": user}
    assert architecture.foreign_assignments(trees=trees) == [
        "pkg.user:2 turn.grant",
        "pkg.user:3 turn.note",
        "pkg.user:4 turn.state.count",
    ]
    assert sorted(architecture.private_reaches(trees=trees)) == [
        "pkg.user:5 gate._waiters",
        "pkg.user:6 gate._release",
    ]


def test_the_cores_owners_keep_their_fields_private() -> None:
    # Issue 29: the lanes, workers and lifecycle owners hand out reads through properties
    # and change only through their methods: no public slot, no public ``self.x = ...``.
    assert architecture.public_owner_fields() == []
    planted = ast.parse(
        "class Owner:\n"
        "    __slots__ = ('_held', 'live')\n"
        "    def __init__(self):\n"
        "        self._held = 0\n"
        "        self.live = 0\n"
        "    @property\n"
        "    def held(self):\n"
        "        return self._held\n"
        "    count: int = read_only('_held', 'The held jobs.')\n"
        "    total: int = 0\n"
        "    limit = 3\n"
    )
    assert architecture.public_owner_fields(trees={"pkg.owner": planted}) == [
        "pkg.owner:2 Owner.live",
        "pkg.owner:5 Owner.live",
        "pkg.owner:10 Owner.total",
        "pkg.owner:11 Owner.limit",
    ]


def test_time_is_read_only_through_the_clock_module() -> None:
    # Issue 29, item 6: one clock per process, injected; no time.* read outside it.
    assert architecture.time_reads() == []


def test_the_clock_check_finds_planted_reads() -> None:
    planted = ast.parse(
        "import asyncio, time\n"
        "from time import monotonic, strftime\n"
        "def f(clock=time.monotonic):\n"
        "    time.sleep(time.time() - time.perf_counter_ns())\n"
        "    loop = asyncio.get_running_loop()\n"
        "    return loop.time(), self._loop.time(), asyncio.get_running_loop().time()\n"
        "def fine(clock):\n"
        "    return time.strftime('%Y'), clock.monotonic(), clock.time(), job.time\n"
    )
    found = architecture.time_reads(trees={"pkg.user": planted, "prioqueue.clock": planted})
    assert sorted(found) == [
        "pkg.user:2 from time import monotonic",
        "pkg.user:3 time.monotonic",
        "pkg.user:4 time.perf_counter_ns",
        "pkg.user:4 time.sleep",
        "pkg.user:4 time.time",
        "pkg.user:6 asyncio.get_running_loop().time",
        "pkg.user:6 loop.time",
        "pkg.user:6 self._loop.time",
    ]


def test_public_types_are_defined_in_public_modules() -> None:
    # Issue 29: a class a public module exports (its ``__all__``) is defined in a public
    # module, so its documented home is where it lives (and a traceback names it there), in
    # the whole tree (``PUBLIC_TYPES_CHECKED``).
    assert architecture.public_types_in_private_modules() == []


def test_the_public_type_check_finds_planted_breaches() -> None:
    def tree(text: str) -> ast.Module:
        return ast.parse(text)

    trees = {
        "pkg": (
            tree(
                "from pkg import _errors\n"
                "from pkg._impl import Store, helper\n"
                "from pkg._errors import *\n"
                "from pkg.public import Fine, Relayed\n"
                "__all__ = ['Store', 'helper', 'Fine', 'Relayed']\n"
                "__all__ += _errors.__all__\n"
            ),
            True,
        ),
        "pkg._impl": (tree("class Store: ...\ndef helper(): ...\n__all__ = ['Store']\n"), False),
        "pkg._errors": (tree("class Oops(Exception): ...\n__all__ = ['Oops']\n"), False),
        "pkg._deep": (tree("class Relayed: ...\n"), False),
        "pkg.public": (
            tree("from pkg._deep import Relayed\nclass Fine: ...\n__all__ = ['Fine']\n"),
            False,
        ),
    }
    assert architecture.public_types_in_private_modules(("pkg",), trees=trees) == [
        "pkg.Oops -> pkg._errors",
        "pkg.Relayed -> pkg._deep",
        "pkg.Store -> pkg._impl",
    ]


def test_no_private_name_is_imported_across_packages() -> None:
    # Issue 29: ``from x import _name`` stays inside x's package (a helper function, a
    # constant or a module alike); a planted one is found, the same package's is not.
    assert architecture.private_name_imports() == []
    trees = {
        "pkg": (ast.parse("from pkg import _impl\n"), True),
        "pkg._impl": (ast.parse("_LIMIT = 1\ndef _helper(): ...\n"), False),
        "pkg.sub": (ast.parse("from ._impl import _helper\n"), False),
        "other": (ast.parse(""), True),
        "other.user": (
            ast.parse(
                "from os import _exit\n"
                "from pkg import _impl, Fine\n"
                "def f():\n"
                "    from pkg._impl import _LIMIT, _helper\n"
            ),
            False,
        ),
    }
    assert architecture.private_name_imports(trees=trees) == [
        "other.user:2 from pkg import _impl",
        "other.user:4 from pkg._impl import _LIMIT",
        "other.user:4 from pkg._impl import _helper",
    ]
