"""The launch tests plan SGLang's router without asking an interpreter what is installed: the
probe (launch/engines.py ``installed_modules``) answers smg, as on a current install; tests of
the probe's other answers set their own."""

from __future__ import annotations

from collections.abc import Sequence

import pytest


@pytest.fixture(autouse=True)
def _router_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    def smg_only(python: str, names: Sequence[str]) -> frozenset[str]:
        return frozenset(names) & {"smg"}

    monkeypatch.setattr("bench_llm.launch.engines.installed_modules", smg_only)
