"""Properties of routing: path normalisation and pattern matching, against brute force."""

from __future__ import annotations

import posixpath

from hypothesis import given
from hypothesis import strategies as st

from prioqueue.gateway._forward import normalise_path
from prioqueue.gateway.body import model_from_url
from prioqueue.gateway.settings import PathSet

SEGMENTS = st.sampled_from(["", ".", "..", "v1", "chat", "completions", "upstream", "x", "a.b"])
PATHS = st.lists(SEGMENTS, max_size=8).map(lambda parts: "/" + "/".join(parts))
PATTERNS = st.lists(
    st.builds(lambda path, star: path + ("*" if star else ""), PATHS, st.booleans()),
    max_size=6,
)


@given(PATHS)
def test_normalising_removes_dot_segments_and_double_slashes(path: str) -> None:
    once = normalise_path(path)
    assert normalise_path(once) == once  # idempotent
    assert "//" not in once
    segments = once.split("/")
    assert "." not in segments
    assert ".." not in segments
    assert once.startswith("/")


@given(PATHS)
def test_normalising_agrees_with_posixpath_on_the_directory(path: str) -> None:
    # posixpath.normpath also drops a trailing slash; compare without it.
    expected = posixpath.normpath("/" + path.lstrip("/"))
    expected = "/" + expected.lstrip("/")  # normpath keeps a leading '//'
    ours = normalise_path(path).rstrip("/") or "/"
    assert ours == (expected.rstrip("/") or "/")


@given(PATTERNS, PATHS)
def test_pathset_matches_like_brute_force(patterns: list[str], path: str) -> None:
    expected = any(path.startswith(p[:-1]) if p.endswith("*") else path == p for p in patterns)
    assert (path in PathSet.of(patterns)) is expected


@given(st.text(alphabet="abc-_.", min_size=1, max_size=10), PATHS)
def test_upstream_paths_name_their_model(model: str, rest: str) -> None:
    assert model_from_url(f"/upstream/{model}{rest}", b"") == model
