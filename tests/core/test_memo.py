"""core.memo.SizedMemo: what it keeps stays within its bound, the oldest going first."""

from __future__ import annotations

from bench_llm.core.memo import SizedMemo


def test_the_oldest_go_first_to_keep_the_total_within_the_limit() -> None:
    memo: SizedMemo[str, int] = SizedMemo(10)
    for i, key in enumerate("abcd"):
        memo.put(key, i, 4)
    assert list(memo) == ["c", "d"] and memo.size == 8
    assert memo.get("a") is None and memo.get("d") == 3
    memo.put("e", 4, 7)  # room for 7: both older ones go
    assert list(memo) == ["e"] and memo.size == 7


def test_a_value_larger_than_the_limit_is_not_kept_and_evicts_nothing() -> None:
    memo: SizedMemo[str, str] = SizedMemo(10)
    memo.put("a", "x", 5)
    memo.put("big", "y", 11)
    assert "big" not in memo and list(memo) == ["a"] and memo.size == 5


def test_putting_a_kept_key_again_counts_its_size_once() -> None:
    memo: SizedMemo[str, int] = SizedMemo(10)
    memo.put("a", 1, 6)
    memo.put("a", 2, 6)
    assert len(memo) == 1 and memo.size == 6 and memo.get("a") == 2
    memo.put("a", 3, 11)  # a new value too large to keep: the old one is not served for it
    assert memo.get("a") is None and memo.size == 0
    memo.put("b", 1, 4)
    memo.clear()
    assert len(memo) == 0 and memo.size == 0
