"""The layout rules of issue 20, asserted (``python tests/architecture.py`` prints the graph)."""

from __future__ import annotations

import architecture


def test_import_graph_has_no_circles() -> None:
    assert architecture.circles(architecture.import_graph()) == []


def test_no_module_imports_another_packages_private_module() -> None:
    assert architecture.private_imports(architecture.import_graph()) == []


def test_modules_are_short() -> None:
    assert architecture.long_modules() == []


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
