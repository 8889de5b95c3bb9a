"""Trace readers: good files parse; corrupted ones fail with one line naming file, line, field."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from bench_llm.workloads.errors import WorkloadError
from bench_llm.workloads.readers import detect_format, read_trace

GOOD = {
    "azure.csv": (
        "azure",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:15:51.0000000,12,3\n",
    ),
    "burst.csv": (
        "burstgpt",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "45,ChatGPT,1087,0,1087,Conversation log\n"
        "118,GPT-4,417,276,693,API log\n",
    ),
    "moon.jsonl": (
        "mooncake",
        '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'
        '{"timestamp": 3000, "input_length": 1100, "output_length": 7, "hash_ids": [0, 1, 2]}\n',
    ),
    "lens.csv": (
        "lengths",
        "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n3772,54,3826,69.8\n2015,156,2171,12.9\n",
    ),
    "mine.jsonl": (
        "bench",
        '{"input_tokens": 100, "output_tokens": 20, "offset_s": 0.0}\n'
        '{"input_tokens": 50, "output_tokens": 10, "offset_s": 0.5, "session_id": "a", "turn": 0}\n',
    ),
}


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("name", sorted(GOOD))
def test_good_files(tmp_path: Path, name: str) -> None:
    fmt, text = GOOD[name]
    p = _write(tmp_path, name, text)
    assert detect_format(p) == fmt
    t = read_trace(p)
    assert t.format == fmt and len(t) >= 2 and np.all(t.input_tokens >= 1) and np.all(t.output_tokens >= 1)


def test_details(tmp_path: Path) -> None:
    az = read_trace(_write(tmp_path, "a.csv", GOOD["azure.csv"][1]))
    assert az.timestamps_s is not None and az.timestamps_s[0] == 0 and abs(az.timestamps_s[1] - 4.314579) < 1e-6
    bg = read_trace(_write(tmp_path, "b.csv", GOOD["burst.csv"][1]))
    assert len(bg) == 2 and bg.dropped == 1 and list(bg.timestamps_s) == [0, 113]  # type: ignore[arg-type]
    mc = read_trace(_write(tmp_path, "m.jsonl", GOOD["moon.jsonl"][1]))
    assert mc.hash_ids == ((0, 1), (0, 1, 2)) and mc.bucket_s == 3.0 and list(mc.timestamps_s) == [0, 3]  # type: ignore[arg-type]
    bj = read_trace(_write(tmp_path, "j.jsonl", GOOD["mine.jsonl"][1]))
    assert bj.session_ids == (None, "a")


def _truncate(text: str) -> str:
    """Cut the file in the middle of its last line."""
    body = text.rstrip("\n")
    last = body.rfind("\n")
    return body[: last + 1 + (len(body) - last) // 2]


def _non_numeric(name: str, text: str) -> str:
    """Put '12x' where the second line's input length is."""
    lines = text.splitlines()
    if name.endswith(".jsonl"):
        lines[1] = re.sub(r'("(?:input_length|input_tokens)": )\d+', r'\1"12x"', lines[1])
    else:
        cells = lines[1].split(",")
        cells[2 if name.startswith("burst") else (1 if name.startswith("azure") else 0)] = "12x"
        lines[1] = ",".join(cells)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("name", sorted(GOOD))
@pytest.mark.parametrize("corruption", ["truncated", "non_numeric", "empty", "header_only"])
def test_corrupted_files(tmp_path: Path, name: str, corruption: str) -> None:
    fmt, text = GOOD[name]
    if corruption == "truncated":
        bad = _truncate(text)
    elif corruption == "non_numeric":
        bad = _non_numeric(name, text)
    elif corruption == "empty":
        bad = ""
    else:
        bad = text.splitlines()[0] + "\n" if name.endswith(".csv") else "\n\n"
    p = _write(tmp_path, name, bad)
    with pytest.raises(WorkloadError) as err:
        read_trace(p, fmt)
    msg = str(err.value)
    assert "\n" not in msg and str(p) in msg, msg
    if corruption in ("truncated", "non_numeric"):
        assert f"{p}:" in msg and msg.split(f"{p}:")[1].split(":")[0].isdigit(), msg  # names the line
    if corruption == "non_numeric":
        assert "field" in msg and "12x" in msg, msg


def test_mooncake_hash_ids_must_cover_input(tmp_path: Path) -> None:
    p = _write(tmp_path, "m.jsonl", '{"timestamp": 0, "input_length": 2000, "output_length": 5, "hash_ids": [0]}\n')
    with pytest.raises(WorkloadError, match=r"m.jsonl:1: field 'hash_ids'"):
        read_trace(p)


def test_missing_column_and_unknown_field(tmp_path: Path) -> None:
    p = _write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n")
    with pytest.raises(WorkloadError, match="(?i)generatedtokens"):
        read_trace(p, "azure")
    q = _write(tmp_path, "b.jsonl", '{"input_tokens": 1, "output_tokens": 2, "colour": "red"}\n')
    with pytest.raises(WorkloadError, match=r"b.jsonl:1: unknown field 'colour'"):
        read_trace(q)


def test_burstgpt_filters_and_azure_2024_timestamps(tmp_path: Path) -> None:
    p = _write(tmp_path, "b.csv", GOOD["burst.csv"][1])
    gpt4 = read_trace(p, model="GPT-4")
    assert len(gpt4) == 1 and gpt4.input_tokens[0] == 417
    assert len(read_trace(p, log_type="Conversation log")) == 1
    with pytest.raises(WorkloadError, match="does not apply"):
        read_trace(_write(tmp_path, "l.csv", GOOD["lens.csv"][1]), model="GPT-4")
    az = _write(
        tmp_path,
        "a24.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.009930+00:00,10,2\n2024-05-10 00:00:01+00:00,5,1\n",
    )
    t = read_trace(az)
    assert np.allclose(t.timestamps_s, [0.0, 0.99007])  # type: ignore[arg-type]
