"""Issue 33: a transport never follows a redirect silently (a 3xx is a recorded failure
naming its target, without the target's credentials)."""

from __future__ import annotations

import pytest

from bench_llm.loadgen.transport import Timeouts
from tests.hostile_server import hostile, make, record_one, run


@pytest.mark.parametrize("kind", ["raw", "python", "aiohttp"])
def test_a_redirect_is_a_failure_naming_its_target(kind: str) -> None:
    with hostile("redirect") as server:
        r = run(record_one(make(kind, server.url, Timeouts(stall=5.0, total=20.0))))
        assert server.requests == 1  # not sent again anywhere
    assert not r.ok and r.error_type == "redirect" and r.http_status == 307
    assert "redirect to http://***@127.0.0.1:9/v1/completions" in (r.error_message or "")
    assert "secret" not in (r.error_message or "")
