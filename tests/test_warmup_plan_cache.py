"""The warm-up's token-count searches kept on disk (policy_runtime/warmup/calls.py, ``_plan_pieces``):
another process reads a search back instead of calling the planner ~16,000 times; anything the
result depends on (the planner's arguments, the token limit, the runtime's source) makes another
file; an unreadable file is searched again; an empty ``POLICY_RUNTIME_CACHE_DIR`` keeps nothing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from policy_runtime.warmup import calls as C

CALLS: list[int] = []


def _kernel():  # stands for a kernel: the plan key reads its __name__
    pass


def counting_planner(n: int, width: int):
    """A planner with three plans over n (each change at a width-dependent threshold)."""
    CALLS.append(n)
    return SimpleNamespace(kernel=_kernel, consts=(width, n > width, n > 4 * width), num_warps=4, info=None)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("POLICY_RUNTIME_CACHE_DIR", str(tmp_path))
    C._plan_pieces.cache_clear()
    CALLS.clear()
    yield tmp_path / "plans"
    C._plan_pieces.cache_clear()


def search(width=8, max_tokens=300):
    """One search as a fresh process would make it (the in-process memo cleared first)."""
    C._plan_pieces.cache_clear()
    CALLS.clear()
    return C._plan_pieces(counting_planner, (width,), max_tokens)


def test_a_search_is_read_back_without_calling_the_planner(store):
    first = search()
    assert len(CALLS) == len(C.token_counts(300)) and len(first) == 3
    assert [n for _, n, _ in first] == [1, 9, 33]  # each plan's first token count
    assert len(list(store.iterdir())) == 1
    assert search() == first and CALLS == []


@pytest.mark.parametrize("change", ["width", "max_tokens", "source"])
def test_what_the_result_depends_on_makes_another_file(store, monkeypatch, change):
    first = search()
    if change == "source":
        monkeypatch.setattr(C, "_source_hash", lambda module_file: "another runtime")
    again = search(width=9 if change == "width" else 8, max_tokens=301 if change == "max_tokens" else 300)
    assert CALLS, "searched again"
    assert len(list(store.iterdir())) == 2
    if change == "source":
        assert again == first


def test_an_unreadable_file_is_searched_again(store):
    first = search()
    (path,) = store.iterdir()
    path.write_bytes(b"not a pickle")
    assert search() == first and CALLS
    assert search() == first and CALLS == []  # written back whole


def test_an_empty_directory_setting_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("POLICY_RUNTIME_CACHE_DIR", "")
    assert C.plan_cache_dir() is None
    first = search()
    assert search() == first and CALLS  # searched every time
    C._plan_pieces.cache_clear()


def test_arguments_whose_repr_holds_an_address_are_not_stored(store):
    C._plan_pieces.cache_clear()
    marker = object()  # repr "<object object at 0x...>": differs between processes
    C._plan_pieces(lambda n, m: counting_planner(n, 8), (marker,), 100)
    assert not store.exists() or not list(store.iterdir())
