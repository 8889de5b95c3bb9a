"""Calibration (issue 36): measured loads -> the simulated engine's constants -> held-out predictions.

The recovery test makes "measurements" with the modelled engine at hidden, perturbed constants
(virtual time: exact and the same on any host), calibrates from the shipped constants, and checks
each constant comes back within a stated tolerance. The CLI test runs the same path from run
folders written by ``bench run`` and checks the calibrated profile predicts a held-out load better
than the shipped one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench_llm.sim.calibrate import KNOBS, MeasuredLoad, current_values, fit, predict, score, with_values
from bench_llm.sim.options import ModelTiming
from bench_llm.sim.virtual import Send
from tests.conftest import REPO, run_cli

HIDDEN = {"t_fixed_ms": 4.0, "per_seq_us": 30.0, "request_overhead_ms": 12.0, "mfu_gemm": 0.5, "mbu": 0.6}
#: Tolerance of the recovered constants (relative). The loads below (tp 1 and 2, prompts of 256
#: and 1024 tokens, batches of 1 to 32) separate them: the per-step fixed time from the weights'
#: read time (which TP halves), the compute rate from the per-sequence CPU time (prefill vs decode).
TOLERANCE = 0.05


def _load(name: str, timing: ModelTiming, truth: ModelTiming, concurrency: int, prompt: int, n: int = 40) -> MeasuredLoad:
    """A closed loop at ``concurrency``, 'measured' on the engine at ``truth``: its sends are the
    closed loop's actual send times there, as a run folder records them."""
    sends = []
    # the first ``concurrency`` start together; the rest follow the measured completions (below)
    for i in range(n):
        sends.append(Send(prompt_len=prompt, max_tokens=24, at_ns=0 if i < concurrency else None))
    from bench_llm.sim.backend import ModelBackend
    from bench_llm.sim.virtual import Plan, run

    result = run(ModelBackend(truth), [dataclasses.replace(s, at_ns=None) for s in sends], Plan(concurrency=concurrency))
    recorded = [Send(prompt_len=prompt, max_tokens=24, at_ns=o.intended_ns - result.t0_ns) for o in result.outcomes]
    ttft = tuple((o.token_ns[0] - o.intended_ns) / 1e6 for o in result.outcomes)
    tpot = tuple((o.token_ns[-1] - o.token_ns[0]) / (len(o.token_ns) - 1) / 1e6 for o in result.outcomes)
    e2e = tuple((o.end_ns - o.intended_ns) / 1e6 for o in result.outcomes if o.end_ns is not None)
    span = (max(o.end_ns for o in result.outcomes if o.end_ns) - result.t0_ns) / 1e9
    return MeasuredLoad(name, timing, tuple(recorded), tuple(range(n)), ttft, tpot, e2e, span)


def _truth(timing: ModelTiming) -> ModelTiming:
    return with_values(timing, {k: HIDDEN[k.name] for k in KNOBS if k.name in HIDDEN})


def test_perturbed_constants_are_recovered_and_predict_held_out_loads() -> None:
    shipped = [ModelTiming(preset="llama-3.1-8b", tp=tp) for tp in (1, 2)]
    loads = [
        _load(f"tp{t.tp}-c{c}-p{p}", t, _truth(t), c, p)
        for t in shipped for c, p in ((1, 256), (8, 1024), (32, 256))
    ]
    fitted = fit(loads, rounds=3)
    shipped_values = current_values(shipped[0])
    for knob in KNOBS:
        got, want = fitted.after[knob], HIDDEN.get(knob.name, shipped_values[knob])
        assert abs(got / want - 1) <= TOLERANCE, (knob.name, got, want)
    held = [_load("tp1-c16-p512", shipped[0], _truth(shipped[0]), 16, 512)]
    before = {s.metric: s for s in score(held, lambda ld: ld.timing)}
    after = {s.metric: s for s in score(held, lambda ld: with_values(ld.timing, fitted.after))}
    for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
        assert after[metric].median_abs_error < 0.03 < before[metric].median_abs_error, (metric, before, after)


def test_a_replay_of_the_exact_constants_reproduces_the_measurement() -> None:
    """The replay is the measurement when the constants are right: calibration's error is the model's."""
    t = ModelTiming(preset="llama-3.1-8b")
    load = _load("c4", _truth(t), _truth(t), 4, 256, n=20)
    p = predict(load.timing, load)
    assert p.ttft_ms == pytest.approx(load.mean_ttft_ms, rel=1e-6)
    assert p.tpot_ms == pytest.approx(load.mean_tpot_ms, rel=1e-6)


@pytest.mark.timeout(240)
def test_calibrate_command_from_run_folders(tmp_path: Path) -> None:
    hidden = tmp_path / "hidden.toml"
    hidden.write_text("[gpu]\nmfu_gemm = 0.5\nmbu = 0.6\n\n[profile]\nt_fixed_ms = 4.0\nrequest_overhead_ms = 12.0\n")
    runs = []
    for c in (1, 4, 8):
        out = tmp_path / f"c{c}"
        p = run_cli(  # each bench command in this process (run_cli): the process is not under test
            "run", "--launch", "--engine", "sim", "--model", "llama-3.1-8b", "--requests", "30", "--concurrency", str(c),
            "--input-tokens", "256", "--output-tokens", "24", f"--engine-arg=--config={hidden}", "--out", str(out),
            "--no-progress", cwd=REPO)
        assert p.returncode == 0, p.stderr
        runs.append(str(out))
    profile = tmp_path / "profile.toml"
    p = run_cli("sim", "calibrate", *runs, "--holdout", runs[1], "--rounds", "1", "--out", str(profile), cwd=REPO)
    assert p.returncode == 0, p.stderr
    rows = {line.split()[0]: line.split() for line in p.stdout.splitlines() if line.startswith(("ttft_ms", "tpot_ms"))}
    for metric in ("ttft_ms", "tpot_ms"):
        shipped_err, calibrated_err = (float(rows[metric][i].rstrip("%")) for i in (1, 4))
        assert calibrated_err < shipped_err and calibrated_err < 5.0, p.stdout
    text = profile.read_text()
    assert "[gpu]" in text and "[profile]" in text and "held out, ttft_ms" in text
    # the profile loads where the simulated engine runs
    d = run_cli("sim", "describe", "--config", str(profile), cwd=REPO)
    assert d.returncode == 0, d.stderr
    again = run_cli("sim", "calibrate", *runs, "--out", str(profile), cwd=REPO)
    assert again.returncode == 2 and "exists" in again.stderr


def _rewrite(run_dir: Path, change: dict[str, object]) -> None:
    """Replace columns of a run's requests (a saturated client, an anomalous stream)."""
    import pyarrow as pa

    from bench_llm.results.reader import read_requests
    from bench_llm.results.writer import write_table_atomic

    table = read_requests(run_dir)
    for name, values in change.items():
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(values, table.schema.field(name).type))
    for f in (run_dir / "requests").glob("*.parquet"):
        f.unlink()
    write_table_atomic(table, run_dir / "requests" / "part-000-000000.parquet")


def test_calibration_leaves_out_saturated_and_anomalous_loads_naming_them(tmp_path: Path) -> None:
    from bench_llm.bench.calibrate import ANOMALIES, CLIENT_SATURATED, BaseConfig, load_measured, screened_loads
    from bench_llm.core.errors import BenchError
    from bench_llm.results.reader import read_requests
    from bench_llm.results.synthetic import synthetic_run

    good, busy, broken = (synthetic_run(tmp_path / n, 20, 6, seed=i) for i, n in enumerate(("good", "busy", "broken")))
    t = read_requests(busy)
    intended = t["intended_send_ns"].to_pylist()
    # the client sent every request 40 ms after its intended time: its send lag, not the engine, set the timings
    _rewrite(busy, {"intended_send_ns": [x - 40_000_000 for x in intended]})
    _rewrite(broken, {"protocol_anomaly": ["event_after_end"] + [None] * 19})
    screened = screened_loads([tmp_path], BaseConfig())
    assert [ld.name for ld in screened.loads] == [str(good)]
    reasons = {(e.name, e.reason) for e in screened.excluded}
    assert reasons == {(str(busy), CLIENT_SATURATED), (str(broken), ANOMALIES)}
    assert all(e.detail for e in screened.excluded)
    assert [ld.name for ld in load_measured([tmp_path], BaseConfig())] == [str(good)]
    # nothing left: refused, each run named with its reason
    with pytest.raises(BenchError, match="every one was left out") as err:
        screened_loads([busy, broken], BaseConfig())
    assert str(busy) in str(err.value) and CLIENT_SATURATED in str(err.value) and ANOMALIES in str(err.value)
    # the command names each run it leaves out, and says so when that empties the held-out set
    p = run_cli("sim", "calibrate", str(good), str(busy), "--holdout", str(busy), "--out", str(tmp_path / "p.toml"), cwd=REPO)
    assert p.returncode == 2 and f"left out: {busy}: {CLIENT_SATURATED}" in p.stderr, p.stderr
    assert "every held-out run was left out" in p.stderr
