"""Schedules: byte-for-byte reproducibility, exact prompt lengths, prefixes, sessions, TOML, replay."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import numpy as np
import orjson
import pytest

from bench_llm.core.tokenizer import count_tokens
from bench_llm.workloads.catalog import build_named_schedule, builtin_names
from bench_llm.workloads.errors import WorkloadError
from bench_llm.workloads.prompts import ServerTokenizeSynth, TokenizerSynth
from bench_llm.workloads.spec import Schedule
from bench_llm.workloads.stats import prefix_reuse
from bench_llm.workloads.synthetic import WorkloadError as SyntheticWorkloadError
from tests.conftest import http_server, shared_path


def _build(ref: str, **kw: object) -> Schedule:
    args: dict[str, object] = {"requests": 60, "rate": 4.0, "arrival": "poisson", "concurrency": None, "warmup": 2, "seed": 7}
    args.update(kw)
    return build_named_schedule(ref, **args)  # type: ignore[arg-type]


def _bytes(s: Schedule) -> bytes:
    return orjson.dumps(
        {"meta": [s.name, s.seed, s.mode, s.rate, s.concurrency, s.arrival, s.description],
         "requests": [dataclasses.asdict(r) for r in s.requests]},
        option=orjson.OPT_SORT_KEYS,
        default=str,
    )


def test_error_class_is_the_synthetic_one() -> None:
    assert WorkloadError is SyntheticWorkloadError


@pytest.mark.parametrize("name", builtin_names())
def test_same_seed_same_bytes_and_exact_lengths(name: str) -> None:
    a, b = _build(name), _build(name)
    assert _bytes(a) == _bytes(b)
    assert _bytes(_build(name, seed=8)) != _bytes(a)
    for spec in a.requests:
        assert spec.prompt is not None and count_tokens(spec.prompt) == spec.input_tokens, spec.request_id
        assert spec.input_tokens_source == "approx"
    assert len(a.warmup) == 2 and len(a.measured) == 60


def test_lengths_do_not_depend_on_arrival() -> None:
    a = _build("chat", arrival="gamma:cv=3")
    b = _build("chat", rate=None, concurrency=4)
    assert [r.input_tokens for r in a.measured] == [r.input_tokens for r in b.measured]
    assert b.mode == "closed" and all(r.send_offset_ns is None for r in b.measured)
    offs = [r.send_offset_ns for r in a.measured]
    assert offs == sorted(offs) and offs[0] == 0  # type: ignore[type-var]


def test_shared_prefix_groups_share_exact_text() -> None:
    s = _build("shared-prefix", requests=400)
    by_group: dict[str, list[str]] = {}
    for r in s.measured:
        assert r.prefix_group is not None
        by_group.setdefault(r.prefix_group, []).append(r.prompt or "")
    assert set(by_group) == {"p0", "p1", "p2", "p3"}
    prefixes = {}
    for g, prompts in by_group.items():
        words = [p.split(" ")[:1024] for p in prompts]
        assert all(w == words[0] for w in words), g
        prefixes[g] = tuple(words[0])
    assert len(set(prefixes.values())) == 4
    share = len(by_group["p0"]) / 400
    assert abs(share - 0.4) < 5 * np.sqrt(0.4 * 0.6 / 400)


def test_sessions_structure() -> None:
    s = _build("multi-turn", requests=200)
    sessions: dict[str, list[int]] = {}
    for r in s.measured:
        assert r.session_id is not None
        sessions.setdefault(r.session_id, []).append(r.turn)
        if r.turn == 0:
            assert r.send_offset_ns is not None and r.think_time_ns == 0
        else:
            assert r.send_offset_ns is None and r.think_time_ns > 0 and 20 <= r.input_tokens <= 200
    assert all(t == list(range(len(t))) for t in sessions.values())
    assert all(2 <= len(t) <= 6 for t in list(sessions.values())[:-1])


def test_toml_workload(tmp_path: Path) -> None:
    p = tmp_path / "w.toml"
    p.write_text(
        'name = "mine"\narrival = "constant"\nrate = 2.0\n'
        "[[lengths.mix]]\nweight = 0.5\nlike = \"code\"\n"
        "[[lengths.mix]]\nweight = 0.5\ninput = { kind = \"uniform\", low = 10, high = 20 }\n"
        "output = { kind = \"fixed\", value = 3 }\n"
        "[prefix]\ngroups = 2\ntokens = 16\nfractions = [0.5, 0.25]\n"
    )
    s = build_named_schedule(str(p), requests=50, rate=None, arrival="poisson", concurrency=None, warmup=0, seed=1)
    assert s.name == "mine" and s.arrival == "constant" and s.rate == 2.0
    assert [r.send_offset_ns for r in s.measured[:3]] == [0, 500_000_000, 1_000_000_000]
    assert any(r.max_output_tokens == 3 for r in s.measured) and any(r.max_output_tokens != 3 for r in s.measured)
    assert {r.prefix_group for r in s.measured} <= {"p0", "p1", None}


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ('[lengths]\nlike = "chat"\ninptu = 3\n', "lengths.inptu"),
        ('[lengths]\ninput = { kind = "fixed", valeu = 3 }\noutput = { kind = "fixed", value = 3 }\n', "lengths.input.valeu"),
        ('[lengths]\nlike = "nope"\n', "unknown built-in"),
        ('[lengths]\ninput = { kind = "fixed" }\noutput = { kind = "fixed", value = 3 }\n', "needs 'value'"),
        ('rate = 1.0\n', "needs a [lengths] or a [trace]"),
        ('[lengths]\nlike = "chat"\n[prefix]\ngroups = 2\nfractions = [0.9, 0.9]\n', "fractions"),
    ],
)
def test_toml_errors_are_one_line(tmp_path: Path, body: str, needle: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(body)
    with pytest.raises(WorkloadError) as err:
        build_named_schedule(str(p), requests=5, rate=1.0, arrival="poisson", concurrency=None, warmup=0, seed=0)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize(
    ("ref", "kw", "needle"),
    [
        ("nope", {}, "not a built-in"),
        ("chat", {"concurrency": 3}, "not both"),
        ("chat", {"rate": None}, "--rate"),
        ("chat", {"rate": -1.0}, "positive"),
        ("chat", {"requests": 0}, "--requests"),
        ("chat", {"arrival": "trace"}, "trace"),
        ("chat", {"arrival": "gamma:cv=-1"}, "cv"),
    ],
)
def test_nonsense_is_rejected(ref: str, kw: dict[str, object], needle: str) -> None:
    from bench_llm.bench.errors import setting_message

    with pytest.raises(WorkloadError) as err:
        _build(ref, **kw)
    # the CLI names the flag (bench.errors.setting_message); the library names the setting
    assert re.search(needle, setting_message(err.value)), setting_message(err.value)
    assert "--" not in str(err.value), err.value


def test_mooncake_replay_shares_blocks_and_spreads_buckets() -> None:
    path = shared_path("traces", "mooncake-fast25", "conversation_trace.jsonl")
    s = build_named_schedule(str(path), requests=300, rate=None, arrival="poisson", concurrency=None, warmup=0, seed=3)
    assert s.arrival == "trace"
    lines = [json.loads(x) for x in path.read_text().splitlines()[:300]]
    specs = s.measured
    for spec, row in zip(specs, lines):
        assert spec.input_tokens == row["input_length"] and spec.max_output_tokens == row["output_length"]
        assert count_tokens(spec.prompt or "") == row["input_length"]
    # requests sharing hash ids share the text of those blocks
    first = {}
    for spec, row in zip(specs, lines):
        words = (spec.prompt or "").split(" ")
        for k, h in enumerate(row["hash_ids"][:-1]):
            block = tuple(words[k * 512 : (k + 1) * 512])
            assert first.setdefault(h, block) == block
    offs = np.array([r.send_offset_ns for r in specs]) / 1e9
    assert np.all(np.diff(offs) >= 0) and np.diff(offs).max() < 3.0  # buckets spread, no 3 s jumps
    fast = build_named_schedule(
        str(path), requests=300, rate=None, arrival="trace:time_scale=0.5", concurrency=None, warmup=0, seed=3
    )
    assert np.allclose([r.send_offset_ns for r in fast.measured], offs * 0.5e9, atol=1)
    assert 0 < prefix_reuse([r["hash_ids"] for r in lines], [r["input_length"] for r in lines], 512) < 1


def test_bench_jsonl_replay(tmp_path: Path) -> None:
    p = tmp_path / "reqs.jsonl"
    p.write_text(
        '{"input_tokens": 5, "output_tokens": 4, "offset_s": 0.0, "prompt": "hello there my good friend"}\n'
        '{"input_tokens": 9, "output_tokens": 2, "offset_s": 1.5, "session_id": "x", "turn": 0}\n'
        '{"input_tokens": 3, "output_tokens": 2, "offset_s": 1.5, "session_id": "x", "turn": 1, "think_time_s": 0.25}\n'
    )
    s = build_named_schedule(str(p), requests=10, rate=None, arrival="poisson", concurrency=None, warmup=0, seed=0)
    a, b, c = s.measured
    assert a.prompt == "hello there my good friend" and a.input_tokens_source == "given"
    assert b.send_offset_ns == 1_500_000_000 and b.session_id == c.session_id and c.turn == 1
    assert c.send_offset_ns is None and c.think_time_ns == 250_000_000


@pytest.fixture()
def tokenize_server() -> Iterator[str]:
    """A /tokenize endpoint that counts words plus one BOS token."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n = len(str(body.get("prompt", "")).split()) + 1
            data = json.dumps({"count": n, "tokens": list(range(n))}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    with http_server(Handler) as url:
        yield url


def test_server_tokenize_calibration(tokenize_server: str) -> None:
    synth = ServerTokenizeSynth(tokenize_server)
    assert synth.describe()["overhead_tokens"] == 1
    s = _build("chat", requests=5, warmup=0, tokenize_url=tokenize_server)
    for r in s.measured:
        assert r.input_tokens_source == "server_tokenize"
        assert len((r.prompt or "").split()) == r.input_tokens


def test_tokenizer_folder_without_package_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    try:
        import tokenizers  # noqa: F401

        pytest.skip("the tokenizers package is installed here")
    except ImportError:
        pass
    with pytest.raises(WorkloadError, match="tokenizers"):
        TokenizerSynth(tmp_path)
    with pytest.raises(WorkloadError, match="no such"):
        TokenizerSynth(tmp_path / "missing")


def test_prefix_reuse_definition() -> None:
    hashes = [[0, 1], [0, 1, 2], [3], [0, 4]]
    lengths = [1024, 1300, 100, 700]
    # reused: 0, 2 blocks (1024), 0, 1 block (512) of 3124 tokens
    assert prefix_reuse(hashes, lengths, 512) == pytest.approx(1536 / 3124)
    # an LRU of 3 blocks has forgotten block 0 by the last request (3, 2, 1 are newer)
    assert prefix_reuse(hashes, lengths, 512, lru_blocks=3) == pytest.approx(1024 / 3124)
