"""Every code sample in the documentation runs, so the docs cannot drift from the code.

Rules:

* Each ```` ```python ```` block of a page is executed; each ```` ```pycon ```` block is run as a
  doctest (its ``>>>`` lines are executed and their printed output compared). A page's blocks
  run in order in one namespace, so a later block may use what an earlier one defined.
* A block preceded by the line ``<!-- not-run -->`` (blank lines allowed in between) is
  skipped: only for code that needs a server or a network. Shell, TOML and text blocks are never
  run.
* A block whose body only includes a file (``--8<-- "examples/x.py"``) shows an example; the
  examples are run by ``tests/test_examples.py`` instead.
* The docstring examples (``>>>``) of every importable ``prioqueue`` module run too: the API
  reference pages are generated from those docstrings.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re
import textwrap
from pathlib import Path
from typing import Any

import attrs
import pytest

import prioqueue

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

# Pages whose code blocks are contracts, not samples: the design note sketches the API in
# pseudo-Python (signatures without bodies), which is meant to be read, not run.
NOT_SAMPLES = {"docs/design/dispatcher.md"}

_FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*)[^\n]*\n"
    r"(?P<body>.*?)"
    r"^(?P=indent)(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
_NOT_RUN = re.compile(r"<!--\s*not-run\s*-->\s*\Z")
_INCLUDE = re.compile(r"^\s*(-{2}8<-{2}\s+\S.*)?$")
_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@attrs.frozen
class Block:
    """One runnable code block of a page."""

    page: str
    line: int
    lang: str
    code: str


def _blocks(path: Path, root: Path = ROOT) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    page = path.relative_to(root).as_posix()
    found = []
    for match in _FENCE.finditer(text):
        lang = match["lang"].lower()
        if lang not in ("python", "py", "pycon"):
            continue
        before = text[: match.start()]
        if _NOT_RUN.search(before):
            continue
        body = textwrap.dedent(match["body"])
        if all(_INCLUDE.match(line) for line in body.splitlines()):
            continue  # an included example file, or an empty block
        line = before.count("\n") + 2  # the first line of the body, 1-based
        found.append(Block(page, line, "pycon" if lang == "pycon" else "python", body))
    return found


def _pages() -> list[Path]:
    pages = sorted(DOCS.rglob("*.md"))
    readme = ROOT / "README.md"
    if readme.exists():
        pages.append(readme)
    return [p for p in pages if p.relative_to(ROOT).as_posix() not in NOT_SAMPLES]


PAGES = [p for p in _pages() if _blocks(p)]


def _run_block(block: Block, namespace: dict[str, Any]) -> None:
    if block.lang == "python":
        # Padding keeps tracebacks pointing at the page's own line numbers.
        source = "\n" * (block.line - 1) + block.code
        exec(compile(source, block.page, "exec"), namespace)
        return
    parser = doctest.DocTestParser()
    test = parser.get_doctest(block.code, namespace, block.page, block.page, block.line - 1)
    runner = doctest.DocTestRunner(optionflags=_FLAGS)
    report: list[str] = []
    runner.run(test, out=report.append, clear_globs=False)
    namespace.update(test.globs)  # DocTest works on a copy: carry its names to the next block
    if runner.failures:
        pytest.fail("".join(report), pytrace=False)


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_page_samples_run(page: Path) -> None:
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    for block in _blocks(page):
        _run_block(block, namespace)


def _modules() -> list[str]:
    names = [prioqueue.__name__]
    for info in pkgutil.walk_packages(prioqueue.__path__, prefix="prioqueue."):
        names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples_run(name: str) -> None:
    try:
        module = importlib.import_module(name)
    except ImportError as exc:  # an optional extra is not installed here
        pytest.skip(f"{name} needs an optional extra: {exc}")
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=_FLAGS)
    report: list[str] = []
    for test in finder.find(module, name):
        runner.run(test, out=report.append)
    if runner.failures:
        pytest.fail("".join(report), pytrace=False)


_GATEWAY_CONFIG = re.compile(
    r"<!--\s*gateway-config\s*-->\s*\n```toml\n(?P<body>.*?)^```", re.MULTILINE | re.DOTALL
)
CONFIGS = [
    (page, match["body"])
    for page in _pages()
    for match in _GATEWAY_CONFIG.finditer(page.read_text(encoding="utf-8"))
]


@pytest.mark.parametrize(
    ("page", "text"), CONFIGS, ids=[p.relative_to(ROOT).as_posix() for p, _ in CONFIGS]
)
def test_gateway_configs_parse(page: Path, text: str) -> None:
    """A ```toml block marked ``<!-- gateway-config -->`` is a valid gateway configuration."""
    from prioqueue._service.config import _load_toml
    from prioqueue.gateway.config import parse_config

    parse_config(_load_toml(text), source=f"{page.name}: ")


def test_the_extractor_finds_and_skips_what_it_should(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "```python\nx = 1\n```\n\n"
        "<!-- not-run -->\n\n```python\nraise SystemExit\n```\n\n"
        "```toml\n[a]\n```\n\n"
        '```python\n--8<-- "examples/job_broker.py"\n```\n\n'
        "!!! note\n    ```pycon\n    >>> x + 1\n    2\n    ```\n",
        encoding="utf-8",
    )
    blocks = _blocks(page, tmp_path)
    assert [(b.lang, b.code.strip()) for b in blocks] == [
        ("python", "x = 1"),
        ("pycon", ">>> x + 1\n2"),
    ]
    namespace: dict[str, Any] = {}
    for block in blocks:
        _run_block(block, namespace)


def test_a_broken_sample_fails(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```pycon\n>>> 1 + 1\n3\n```\n", encoding="utf-8")
    (block,) = _blocks(page, tmp_path)
    with pytest.raises(pytest.fail.Exception, match="Expected"):
        _run_block(block, {})
    page.write_text("```python\nassert 1 + 1 == 3\n```\n", encoding="utf-8")
    (block,) = _blocks(page, tmp_path)
    with pytest.raises(AssertionError):
        _run_block(block, {})


def _install_lines() -> list[tuple[str, str]]:
    """Every line of the docs, the README and the package's messages that tells a pip install."""
    found = []
    sources = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    sources += sorted((ROOT / "src").rglob("*.py"))
    for path in sources:
        for line in path.read_text(encoding="utf-8").splitlines():
            if "pip install" in line:
                found.append((path.relative_to(ROOT).as_posix(), line))
    return found


def test_install_lines_work_on_a_fresh_machine() -> None:
    # `pip install 'prioqueue-lanes[broker]'` failed as written: the distribution is not
    # published. Every install line installs from a clone; the index name only with its caveat.
    lines = _install_lines()
    assert any("pip install '.[broker]'" in line for _, line in lines)
    for where, line in lines:
        if "prioqueue-lanes" in line:
            assert "release" in line, f"{where}: {line.strip()}"
