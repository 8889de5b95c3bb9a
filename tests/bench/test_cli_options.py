"""The option groups ``bench run`` and ``bench locust master`` share, and library errors that
name settings (the CLI shows their flags)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from bench_llm.bench.errors import setting_message
from bench_llm.bench.run_options import LoadOptions, load_options, output_options
from bench_llm.core.errors import SettingError
from bench_llm.workloads.errors import WorkloadError
from bench_llm.workloads.synthetic import SyntheticWorkload


def _option_names(cmd: click.Command) -> set[str]:
    return {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)}


def test_run_and_master_declare_the_shared_options_once() -> None:
    from bench_llm.bench.commands.locust import master
    from bench_llm.bench.commands.run import command as run

    shared = {
        "--url", "--engine", "--api", "--model", "--out", "--overwrite", "--workload", "--requests",
        "--input-tokens", "--output-tokens", "--rate", "--arrival", "--concurrency", "--warmup", "--seed",
        "--duration", "--stall-timeout", "--api-key-env", "--api-key-file", "--save-text", "--slo",
        "--percentiles", "--json",
    }
    assert shared <= _option_names(run) and shared <= _option_names(master)
    by_name = {p.name: p for p in master.params}
    assert by_name["url"].required and not {p.name: p for p in run.params}["url"].required


def test_a_group_hands_the_command_one_typed_value() -> None:
    seen: list[object] = []

    @click.command()
    @load_options()
    @output_options()
    def cmd(load: LoadOptions, output: object) -> None:
        seen.append(load)
        seen.append(output)

    res = CliRunner().invoke(cmd, ["--rate", "2.5", "--requests", "7", "--out", "x", "--slo", "ttft_ms=100"])
    assert res.exit_code == 0, res.output
    load = seen[0]
    assert isinstance(load, LoadOptions) and load.rate == 2.5 and load.requests == 7 and load.arrival is None
    assert seen[1].slo.as_dict() == {"ttft_ms": 100.0}  # type: ignore[attr-defined]


def test_library_errors_name_the_setting_and_the_cli_its_flag() -> None:
    with pytest.raises(WorkloadError) as err:
        SyntheticWorkload(requests=1, input_tokens=0, rate=1.0).schedule()
    assert str(err.value) == "input_tokens and output_tokens must be at least 1"
    assert setting_message(err.value) == "--input-tokens and --output-tokens must be at least 1"
    assert SettingError("$url 'x': no scheme").settings == ("url",)
    assert setting_message(ValueError("plain")) == "plain"


def test_cli_output_keeps_the_flag(tmp_path: object) -> None:
    from bench_llm.bench.cli import cli

    res = CliRunner().invoke(cli, ["run", "--requests", "0", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "error: --requests must be at least 1" in res.output, res.output
