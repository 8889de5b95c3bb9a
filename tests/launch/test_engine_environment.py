"""An engine bench launches gets the user's environment, not what bench set for its own
memory (core/memory.py sets Arrow's allocator for bench's processes only)."""

from __future__ import annotations

import os

import pytest

import bench_llm.core.memory as memory
from bench_llm.launch.launcher import engine_environment

VAR = memory.ARROW_POOL_VARIABLE


def test_bench_own_allocator_setting_stays_out_of_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VAR, raising=False)
    monkeypatch.setattr(memory, "_SET_HERE", False)
    memory.use_system_allocator()
    assert os.environ[VAR] == "system"  # bench itself uses it
    env = engine_environment({"ENGINE_DEFAULT": "1"}, {"USER_SET": "2"}, "0,1")
    assert VAR not in env
    assert env["ENGINE_DEFAULT"] == "1" and env["USER_SET"] == "2" and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    # the user's --env may still give it to the engine
    assert engine_environment({}, {VAR: "jemalloc"}, None)[VAR] == "jemalloc"


def test_a_user_setting_reaches_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VAR, "mimalloc")
    monkeypatch.setattr(memory, "_SET_HERE", False)
    memory.use_system_allocator()  # leaves the user's choice alone
    assert os.environ[VAR] == "mimalloc"
    assert engine_environment({}, {}, None)[VAR] == "mimalloc"


def test_user_env_wins_over_engine_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BENCH_T_X", raising=False)
    env = engine_environment({"BENCH_T_X": "default"}, {"BENCH_T_X": "user"}, None)
    assert env["BENCH_T_X"] == "user"
