"""The shape of ``src/prioqueue``, computed from its code with ``ast``.

Run ``python tests/architecture.py`` to print the import graph and every breach of the layout
rules; ``tests/test_architecture.py`` asserts them:

* the import graph has no circles (imports under ``TYPE_CHECKING`` and inside functions
  count: a circle is a circle to a reader even when Python tolerates it);
* no module imports another package's private module (``a._x`` may be imported from ``a``
  and below it only);
* no module over ``MAX_MODULE_LINES`` lines, no function over ``MAX_FUNCTION_LINES`` lines
  (its docstring not counted; a nested function counts within the one that holds it);
* state has one owner (issue 29): no attribute is assigned on an object other than ``self``
  or ``cls`` outside the module that defines its class (:func:`foreign_assignments`), and no
  ``obj._private`` is reached from a module that does not define it (:func:`private_reaches`).
  Both are asserted for the whole tree (every module under ``src``, any added later too);
  the only exceptions are other libraries' documented setters and names
  (``THIRD_PARTY_SETTERS``, ``THIRD_PARTY_PRIVATE``), each with its reason.
* the core has one owner (issue 29, item 1): only the core's own modules and its facades
  (``CORE_FACADES``: ``dispatcher``, ``fleet``) import ``prioqueue._core`` (:func:`core_imports`);
* one clock (issue 29, item 6): no ``time.time``/``time.monotonic``/``time.sleep``/
  ``time.perf_counter`` (nor their ``_ns`` forms, nor ``from time import`` them) and no
  ``loop.time()`` outside ``CLOCK_MODULES`` (:func:`time_reads`); adapters read time through
  an injected ``prioqueue.clock.Clock``.

Without types, "the module that defines its class" is read as: the module defines a class
that declares the attribute (a class-level name or annotation, a method, a ``__slots__``
entry, or an assignment to ``self.<name>`` in one of its methods). A breach is therefore never
a false alarm about a class of the same module; an attribute of the same name declared by an
unrelated class of the module would hide one (rare, and visible in review).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
MAX_MODULE_LINES = 500
# Issue 29: split by ownership, not by a line count. A module that is one owner or one concern
# may pass MAX_MODULE_LINES when its docstring says so with ONE_THING (and why); none passes
# HARD_MODULE_LINES, past which two concerns have surely grown together.
ONE_THING = "one concern, past the 500-line gauge on purpose"
HARD_MODULE_LINES = 700
MAX_FUNCTION_LINES = 80
THIRD_PARTY_SETTERS = frozenset(
    {
        "self.server.should_exit",
        "parser.epilog",
        "response.status_code",
        "app.state.broker",
        "app.state.config",
        "app.state.broker_started",
        "fatal.__cause__",
    }
)
"""Attributes of other libraries' objects that those libraries document as the way to use
them: uvicorn's ``Server.should_exit`` (how a server is asked to stop); argparse's
``ArgumentParser.epilog`` (set on a subcommand's parser, which ``prioqueue.cli`` builds);
FastAPI's ``Response.status_code`` (a route's injected response, to answer 200 instead of
201); Starlette's ``app.state`` (the documented place for an application's own objects,
which ``prioqueue.broker.app`` fills and ``prioqueue.broker.cli`` marks started); and
Python's ``BaseException.__cause__`` (an exception chained to another without raising it,
in ``prioqueue.store._commit``)."""
THIRD_PARTY_PRIVATE = frozenset({"os._exit"})
"""Underscored names of other libraries that are their documented API: ``os._exit`` (leave
the process at once, without cleanup: the broker's crash-only stop and the job supervisor's
child after ``fork``)."""

CORE = "prioqueue._core"
CORE_FACADES = ("prioqueue.dispatcher", "prioqueue.fleet")
"""The only modules outside ``CORE`` that import it: the two public dispatchers, which hold
the core's state (issue 29, item 1). No exception remains: the dashboard model and the broker
read the dispatchers' views, and the constants other packages need are re-exported by
``prioqueue.dispatcher`` (``DEFAULT_CROSSING_SHARE``) or read from ``prioqueue._spec``
(``LEVEL_LIMIT``)."""


CLOCK_MODULES = ("prioqueue.clock", "prioqueue.store.clock", "prioqueue.client._supervise")
"""The only modules that may read the process's clocks: ``prioqueue.clock``; the store's
anchored clock; and the job supervisor, a stdlib-only script run as its own process
(``python -I -S``, so it cannot import ``prioqueue``): one clock per process."""
TIME_READS = frozenset(
    f"{name}{ns}" for name in ("time", "monotonic", "sleep", "perf_counter") for ns in ("", "_ns")
) - {"sleep_ns"}
"""The ``time`` functions that read or wait on a clock."""


def _name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module under ``src``, by dotted name."""
    return {_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _targets(
    mod: str, node: ast.Import | ast.ImportFrom, is_package: bool, known: dict[str, Path]
) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        package = mod.split(".") if is_package else mod.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        yield sub if sub in known else base


def import_graph() -> dict[str, set[str]]:
    """``module -> modules of this project it imports`` (anywhere in its code)."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for mod, path in known.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for name in _targets(mod, node, path.name == "__init__.py", known):
                target = name
                while target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in known and target != mod:
                    deps.add(target)
        graph[mod] = deps
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def private_imports(graph: dict[str, set[str]]) -> list[str]:
    """``importer -> module`` for each import of a private module from outside its package."""
    known = modules()
    breaches: list[str] = []
    for mod, deps in sorted(graph.items()):
        home = mod if known[mod].name == "__init__.py" else mod.rpartition(".")[0]
        for dep in sorted(deps):
            parts = dep.split(".")
            for i, part in enumerate(parts):
                if part.startswith("_") and not part.startswith("__"):
                    owner = ".".join(parts[:i])
                    if home != owner and not home.startswith(owner + "."):
                        breaches.append(f"{mod} -> {dep}")
                    break
    return breaches


def core_imports(graph: dict[str, set[str]]) -> list[str]:
    """``importer -> module`` for each import of the core from outside it and its facades.

    Only the core's own modules (``CORE`` and below) and ``CORE_FACADES`` may import
    ``prioqueue._core``: every other module reads a dispatcher through its public methods,
    which hand out copies (issue 29: the state has one owner; ``state_of`` is gone).
    """
    breaches: list[str] = []
    for mod, deps in sorted(graph.items()):
        if mod == CORE or mod.startswith(CORE + ".") or mod in CORE_FACADES:
            continue
        breaches.extend(
            f"{mod} -> {dep}" for dep in sorted(deps) if dep == CORE or dep.startswith(CORE + ".")
        )
    return breaches


def declared_one_thing(text: str) -> bool:
    """Whether a module's docstring declares it one concern past the gauge (``ONE_THING``)."""
    doc = ast.get_docstring(ast.parse(text)) or ""
    return ONE_THING in " ".join(doc.split())


def long_modules() -> list[str]:
    """Modules over ``MAX_MODULE_LINES`` lines that do not declare ``ONE_THING``, or over
    ``HARD_MODULE_LINES`` whatever they declare."""
    out = []
    for mod, path in modules().items():
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > HARD_MODULE_LINES or (lines > MAX_MODULE_LINES and not declared_one_thing(text)):
            out.append(f"{mod}: {lines} lines")
    return out


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    first = node.body[0] if node.body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
        and first.end_lineno is not None
    ):
        return first.end_lineno - first.lineno + 1
    return 0


def long_functions() -> list[str]:
    """Functions over ``MAX_FUNCTION_LINES`` lines, docstrings not counted."""
    out = []
    for mod, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                end = node.end_lineno or node.lineno
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = end - start + 1 - _docstring_lines(node)
                if lines > MAX_FUNCTION_LINES:
                    out.append(f"{mod}:{node.lineno} {node.name}: {lines} lines")
    return out


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def declared(tree: ast.Module) -> set[str]:
    """The attribute names the classes of one module declare (see the module notes)."""
    names: set[str] = set()
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        for item in cls.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(item.name)
            targets: list[ast.expr] = []
            if isinstance(item, ast.Assign):
                targets = item.targets
            elif isinstance(item, ast.AnnAssign):
                targets = [item.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                    if target.id == "__slots__" and isinstance(item, ast.Assign):
                        names.update(
                            elt.value
                            for elt in ast.walk(item.value)
                            if isinstance(elt, ast.Constant) and isinstance(elt.value, str)
                        )
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Attribute)
                and _is_self(node.value)
                and isinstance(node.ctx, ast.Store)
            ):
                names.add(node.attr)
    return names


def _reaching(graph: dict[str, set[str]], targets: set[str]) -> set[str]:
    """The modules that import one of ``targets``, directly or through others (and those)."""
    found = set(targets)
    grew = True
    while grew:
        grew = False
        for mod, deps in graph.items():
            if mod not in found and deps & found:
                found.add(mod)
                grew = True
    return found


def _sources(scope: Iterable[str] | None) -> dict[str, ast.Module]:
    known = modules()
    chosen = sorted(known) if scope is None else list(scope)
    return {mod: ast.parse(known[mod].read_text(encoding="utf-8")) for mod in chosen}


def foreign_assignments(
    scope: Iterable[str] | None = None, *, trees: dict[str, ast.Module] | None = None
) -> list[str]:
    """``module:line obj.attr`` for each assignment (or ``del``) of an attribute on an object
    other than ``self``/``cls`` that no class of the module declares.

    Args:
        scope: The modules to check (None: every module under ``src``).
        trees: Parsed modules to check instead (for planted examples).
    """
    out = []
    for mod, tree in sorted((trees if trees is not None else _sources(scope)).items()):
        own = declared(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store | ast.Del)
                and not _is_self(node.value)
                and node.attr not in own
                and ast.unparse(node) not in THIRD_PARTY_SETTERS
            ):
                out.append(f"{mod}:{node.lineno} {ast.unparse(node)}")
    return out


CORE_OWNERS = ("prioqueue._core.lanes", "prioqueue._core.workers", "prioqueue._core.lifecycle")
"""The modules of the core's owners (issue 29): each a class whose fields are all private."""


def public_owner_fields(
    scope: Iterable[str] = CORE_OWNERS, *, trees: dict[str, ast.Module] | None = None
) -> list[str]:
    """``module:line Class.field`` for each public field of a core owner: a public name in its
    ``__slots__``, a public attribute assigned on ``self``, or a public class attribute that is
    not a ``read_only(...)`` read (reads go through properties).

    Args:
        scope: The owners' modules (default: ``CORE_OWNERS``).
        trees: Parsed modules to check instead (for planted examples).
    """
    out = []
    for mod, tree in sorted((trees if trees is not None else _sources(scope)).items()):
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                names: list[tuple[int, str]] = []
                if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
                ):
                    for elt in getattr(node.value, "elts", []):
                        if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                            names.append((node.lineno, elt.value))
                elif (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.ctx, ast.Store)
                    and _is_self(node.value)
                ):
                    names.append((node.lineno, node.attr))
                out += [f"{mod}:{line} {cls.name}.{name}" for line, name in names if name[0] != "_"]
            for stmt in cls.body:  # a class attribute: only a ``read_only(...)`` read
                value: ast.expr | None
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                    target, value = stmt.targets[0], stmt.value
                elif isinstance(stmt, ast.AnnAssign):
                    target, value = stmt.target, stmt.value
                else:
                    continue
                if (
                    isinstance(target, ast.Name)
                    and target.id[0] != "_"
                    and not (
                        isinstance(value, ast.Call)
                        and isinstance(value.func, ast.Name)
                        and value.func.id == "read_only"
                    )
                ):
                    out.append(f"{mod}:{stmt.lineno} {cls.name}.{target.id}")
    return out


def private_reaches(
    scope: Iterable[str] | None = None,
    *,
    into: str | None = None,
    trees: dict[str, ast.Module] | None = None,
) -> list[str]:
    """``module:line obj._name`` for each private attribute reached on an object other than
    ``self``/``cls`` that no class of the module declares.

    Args:
        scope: The modules to check (None: every module under ``src``).
        into: Only reaches of names that the classes of this package (or module) declare,
            from modules that import it (directly or through others), e.g.
            ``"prioqueue._driver"``: who reaches into the driver.
        trees: Parsed modules to check instead (for planted examples).
    """
    chosen = trees if trees is not None else _sources(scope)
    targets: set[str] | None = None
    if into is not None:
        inside = _sources(m for m in modules() if m == into or m.startswith(into + "."))
        targets = set().union(*(declared(tree) for tree in inside.values()))
        users = _reaching(import_graph(), set(inside))
        chosen = {mod: tree for mod, tree in chosen.items() if mod in users}
    out = []
    for mod, tree in sorted(chosen.items()):
        own = declared(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and _is_private(node.attr)
                and not _is_self(node.value)
                and node.attr not in own
                and ast.unparse(node) not in THIRD_PARTY_PRIVATE
                and (targets is None or node.attr in targets)
            ):
                out.append(f"{mod}:{node.lineno} {ast.unparse(node)}")
    return out


def private_name_imports(*, trees: dict[str, tuple[ast.Module, bool]] | None = None) -> list[str]:
    """``importer:line from module import _name`` for each private name (a function, a
    class, a constant or a module) imported from outside the package that holds it.

    :func:`private_imports` sees private modules; this also sees ``from m import _helper``.

    Args:
        trees: ``module -> (tree, is_package)`` to check instead (for planted examples).
    """
    if trees is None:
        trees = {
            m: (ast.parse(p.read_text(encoding="utf-8")), p.name == "__init__.py")
            for m, p in modules().items()
        }
    packages = {m for m, (_, is_package) in trees.items() if is_package}
    out = []
    for mod, (tree, is_package) in sorted(trees.items()):
        home = mod if is_package else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = _resolve(mod, node.level, node.module, is_package)
            if not source.startswith("prioqueue") and source not in trees:
                continue
            owner = source if source in packages else source.rpartition(".")[0]
            if home == owner or home.startswith(owner + "."):
                continue
            out += [
                f"{mod}:{node.lineno} from {source} import {alias.name}"
                for alias in node.names
                if _is_private(alias.name)
            ]
    return out


PUBLIC_TYPES_CHECKED = ("prioqueue",)
"""The packages held to :func:`public_types_in_private_modules`: the whole tree (issue 29)."""


def _is_private_module(mod: str) -> bool:
    return any(_is_private(part) for part in mod.split("."))


def _resolve(mod: str, level: int, base: str | None, is_package: bool) -> str:
    """The module a ``from`` import names, absolute."""
    if not level:
        return base or ""
    package = mod.split(".") if is_package else mod.split(".")[:-1]
    package = package[: len(package) - (level - 1)]
    return ".".join([*package, base] if base else package)


class _Exports:
    """One module's top-level classes, ``from`` imports and ``__all__``, read from its tree."""

    def __init__(self, mod: str, tree: ast.Module, is_package: bool) -> None:
        self.classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
        self.imported: dict[str, tuple[str, str]] = {}
        """Local name -> (module, name there) of each ``from m import name``."""
        self.stars: list[str] = []
        self.names: list[str] = []
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                source = _resolve(mod, node.level, node.module, is_package)
                for alias in node.names:
                    if alias.name == "*":
                        self.stars.append(source)
                    else:
                        self.imported[alias.asname or alias.name] = (source, alias.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                if isinstance(target, ast.Name) and target.id == "__all__" and node.value:
                    self.names += self._listed(node.value)

    def _listed(self, value: ast.expr) -> list[str]:
        if isinstance(value, ast.List | ast.Tuple):
            return [
                e.value
                for e in value.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            ]
        if isinstance(value, ast.BinOp):
            return self._listed(value.left) + self._listed(value.right)
        if (  # ``__all__ += _errors.__all__``: that module's names, resolved later
            isinstance(value, ast.Attribute)
            and value.attr == "__all__"
            and isinstance(value.value, ast.Name)
        ):
            return [f"*{value.value.id}"]
        return []


def public_types_in_private_modules(
    scope: Iterable[str] = PUBLIC_TYPES_CHECKED,
    *,
    trees: dict[str, tuple[ast.Module, bool]] | None = None,
) -> list[str]:
    """``module.Name -> defining module`` for each class a public module's ``__all__`` names
    that a private module defines (issue 29: a public type lives in a public module).

    Re-exports are followed through ``from`` imports (``*`` included) to the class's
    definition; every public module is checked, so a chain is caught at its first public
    module. A name defined by no module found (a function, a constant) is not a type.

    Args:
        scope: The packages (or modules) whose public modules are checked.
        trees: ``module -> (tree, is_package)`` to check instead (for planted examples).
    """
    if trees is None:
        known = modules()
        trees = {
            m: (ast.parse(p.read_text(encoding="utf-8")), p.name == "__init__.py")
            for m, p in known.items()
        }
    read = {mod: _Exports(mod, tree, pkg) for mod, (tree, pkg) in trees.items()}

    def home(mod: str, name: str, depth: int = 0) -> str | None:
        info = read.get(mod)
        if info is None or depth > 20:
            return None
        if name in info.classes:
            return mod
        if name in info.imported:
            return home(*info.imported[name], depth + 1)
        for star in info.stars:
            found = home(star, name, depth + 1)
            if found is not None:
                return found
        return None

    out = []
    for mod, info in sorted(read.items()):
        inside = any(mod == p or mod.startswith(p + ".") for p in scope)
        if not inside or _is_private_module(mod):
            continue
        names = list(info.names)
        for alias in [n[1:] for n in names if n.startswith("*")]:
            source = info.imported.get(alias)
            target = f"{source[0]}.{source[1]}" if source else alias
            names += read[target].names if target in read else []
        for name in sorted({n for n in names if not n.startswith("*")}):
            found = home(mod, name)
            if found is not None and _is_private_module(found):
                out.append(f"{mod}.{name} -> {found}")
    return out


def _reads_loop_time(node: ast.Attribute) -> bool:
    """``loop.time``, ``self._loop.time``, ``asyncio.get_running_loop().time``..."""
    if node.attr != "time":
        return False
    owner = node.value
    if isinstance(owner, ast.Call):
        owner = owner.func
    name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
    return name.lower().endswith(("loop", "get_running_loop", "get_event_loop"))


def time_reads(
    scope: Iterable[str] | None = None, *, trees: dict[str, ast.Module] | None = None
) -> list[str]:
    """``module:line expression`` for each clock read outside ``CLOCK_MODULES``.

    A read is ``time.<f>`` or ``from time import <f>`` for ``f`` in ``TIME_READS`` (called
    or passed as a value, e.g. a ``clock=time.monotonic`` default), or an event loop's
    ``.time`` (``loop.time``, ``self._loop.time``, ``get_running_loop().time``).

    Args:
        scope: The modules to check (None: every module under ``src``).
        trees: Parsed modules to check instead (for planted examples).
    """
    out = []
    for mod, tree in sorted((trees if trees is not None else _sources(scope)).items()):
        if mod in CLOCK_MODULES:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "time":
                out += [
                    f"{mod}:{node.lineno} from time import {alias.name}"
                    for alias in node.names
                    if alias.name in TIME_READS or alias.name == "*"
                ]
            elif isinstance(node, ast.Attribute) and (
                (
                    isinstance(node.value, ast.Name)
                    and node.value.id == "time"
                    and node.attr in TIME_READS
                )
                or _reads_loop_time(node)
            ):
                out.append(f"{mod}:{node.lineno} {ast.unparse(node)}")
    return out


def main() -> int:
    """Print the graph and the breaches; exit 1 if there is any."""
    graph = import_graph()
    for mod in sorted(graph):
        print(f"{mod} -> {', '.join(sorted(graph[mod])) or '(nothing)'}")
    problems = {
        "circles": [" <-> ".join(c) for c in circles(graph)],
        "private imports": private_imports(graph),
        "private names imported across packages": private_name_imports(),
        "imports of the core outside it and its facades": core_imports(graph),
        f"modules over {MAX_MODULE_LINES} lines": long_modules(),
        f"functions over {MAX_FUNCTION_LINES} lines": long_functions(),
        "foreign attribute assignments": foreign_assignments(),
        "private reaches": private_reaches(),
        "private reaches into prioqueue._driver (whole tree)": private_reaches(
            None, into="prioqueue._driver"
        ),
        "clock reads outside the clock modules": time_reads(),
        "public types defined in private modules": public_types_in_private_modules(),
        "public fields of the core's owners": public_owner_fields(),
    }
    for title, items in problems.items():
        print(f"\n{title}: {len(items)}")
        for item in items:
            print(f"  {item}")
    return 1 if any(problems.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
