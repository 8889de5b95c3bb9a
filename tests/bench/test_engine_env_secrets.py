"""A secret in the engine's environment is passed by name and never written: a sweep's definition
(sweep.json) and its stored command line hold what the spec holds, so the spec must not hold it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench_llm.bench.sweep.spec import LoadSpec, MatrixSpec, SweepSpec, SweepSpecError
from tests.conftest import run_cli

SECRET = "hf_planted-0123456789-secret"


def _spec(*env: str) -> SweepSpec:
    return SweepSpec(model="org/model", engine="vllm", gpus=1, matrix=MatrixSpec(tp=(1,)),
                     loads=LoadSpec(rates=(1.0,)), engine_env=env)  # fmt: skip


def test_a_secret_value_is_refused_and_the_refusal_does_not_repeat_it() -> None:
    with pytest.raises(SweepSpecError) as err:
        _spec(f"HF_TOKEN={SECRET}").validate()
    assert "--engine-env HF_TOKEN" in str(err.value) and SECRET not in str(err.value)
    _spec("VLLM_SERVER_DEV_MODE=1", "HF_TOKEN").validate()  # a plain value, and a secret by name
    for bad in ("=1", "1X=2", "A B=3", ""):
        with pytest.raises(SweepSpecError, match="expected NAME=value or NAME"):
            _spec(bad).validate()


def test_a_variable_passed_by_name_takes_bench_s_value_when_the_engine_starts() -> None:
    spec = _spec("VLLM_SERVER_DEV_MODE=1", "HF_TOKEN")
    assert spec.engine_env_pairs({"HF_TOKEN": SECRET}) == (("VLLM_SERVER_DEV_MODE", "1"), ("HF_TOKEN", SECRET))
    with pytest.raises(SweepSpecError, match="engine_env HF_TOKEN: not set in bench's environment"):
        spec.engine_env_pairs({})
    assert spec.engine_env_pairs({}, dry_run=True)[1] == ("HF_TOKEN", "***")  # a dry run reads no value


def test_the_load_job_sent_to_a_cluster_carries_no_engine_environment() -> None:
    from bench_llm.bench.sweep.loads import Load, LoadJob
    from bench_llm.bench.sweep.spec import WorkloadSpec
    from bench_llm.results.sweep_rows import LoadRef, RunMeta

    w = WorkloadSpec(input_tokens=64, output_tokens=8)
    meta = RunMeta("abc123", {"tp": 1, "cell_id": "tp1"}, LoadRef("rate", 1.0, "rate-1"), "w", 0, False, "load")
    row = LoadJob(_spec("VLLM_SERVER_DEV_MODE=1", "HF_TOKEN"), Load("rate", 1.0, w), "org/model", meta, 0).to_row()
    assert row["spec"]["engine_env"] == ()
    assert LoadJob.from_row(json.loads(json.dumps(row))).spec.engine_env == ()


def test_sweep_json_and_the_stored_command_hold_the_name_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_T_API_TOKEN", SECRET)
    out = tmp_path / "sweep"
    common = ("sweep", "--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100", "--gpus", "1", "--tp", "1",
              "--rate", "2", "--requests", "8", "--input-tokens", "32", "--output-tokens", "4", "--out", str(out))  # fmt: skip
    refused = run_cli(*common, "--engine-env", f"BENCH_T_API_TOKEN={SECRET}")
    assert refused.returncode != 0 and SECRET not in refused.stdout + refused.stderr
    assert not out.exists() or SECRET not in "".join(p.read_text(errors="replace") for p in out.rglob("*") if p.is_file())
    done = run_cli(*common, "--engine-env", "BENCH_T_API_TOKEN")
    assert done.returncode == 0, done.stdout + done.stderr
    written = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "sweep.json" for p in written)
    assert "BENCH_T_API_TOKEN" in (out / "sweep.json").read_text()
    for p in written:
        assert SECRET.encode() not in p.read_bytes(), p
    monkeypatch.delenv("BENCH_T_API_TOKEN")
    unset = run_cli(*common[:-1], str(tmp_path / "other"), "--engine-env", "BENCH_T_API_TOKEN")
    assert unset.returncode != 0 and "BENCH_T_API_TOKEN: not set" in unset.stdout + unset.stderr


def test_a_kubernetes_dry_run_shows_the_secret_by_reference_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRET)
    shown = run_cli("sweep", "--dry-run", "--engine", "vllm", "--model", "org/m", "--gpus", "4", "--tp", "1",
                    "--rate", "1", "--cluster", "kubernetes", "--gpus-per-node", "4", "--namespace", "bench",
                    "--image", "img", "--client-image", "bimg", "--engine-env", "HF_TOKEN")  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert SECRET not in shown.stdout and 'kind: "Secret"' in shown.stdout and 'HF_TOKEN: "***"' in shown.stdout
    assert 'secretKeyRef:\n                  name: "tp1-env"\n                  key: "HF_TOKEN"' in shown.stdout
