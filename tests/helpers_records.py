"""Constructing request records and run folders for analysis tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench_llm.results.record import RequestRecord
from bench_llm.results.writer import RequestsWriter, write_run_meta

MS = 1_000_000


def record(
    rid: str,
    send_ms: float,
    chunks: list[tuple[float, int]],
    *,
    ok: bool = True,
    phase: str = "measure",
    error_type: str | None = None,
    intended_ms: float | None = None,
    end_ms: float | None = None,
    completion_tokens: int | None = None,
    max_output_tokens: int | None = None,
    input_tokens: int = 10,
) -> RequestRecord:
    ts = [int(t * MS) for t, _ in chunks]
    tk = [n for _, n in chunks]
    token_ts = [t for t, n in zip(ts, tk) if n > 0]
    out = sum(tk)
    return RequestRecord(
        request_id=rid,
        phase=phase,
        worker_id=0,
        intended_send_ns=int((send_ms if intended_ms is None else intended_ms) * MS),
        send_ns=int(send_ms * MS),
        first_byte_ns=int(send_ms * MS) + 1,
        first_token_ns=token_ts[0] if token_ts else None,
        first_content_ns=token_ts[0] if token_ts else None,
        end_ns=int(end_ms * MS) if end_ms is not None else (ts[-1] if ts else int(send_ms * MS)),
        chunk_ns=ts,
        chunk_tokens=tk,
        output_tokens=out,
        token_source="server_cumulative",
        input_tokens_target=input_tokens,
        input_tokens_source="approx",
        max_output_tokens=max_output_tokens if max_output_tokens is not None else out,
        prompt_tokens=input_tokens,
        completion_tokens=out if completion_tokens is None else completion_tokens,
        cached_tokens=None,
        http_status=200 if ok else 500,
        finish_reason="length" if ok else None,
        ok=ok,
        error_type=error_type if not ok else None,
        error_message="x" if not ok else None,
        server_request_id=None,
    )


def write_run(run_dir: Path, records: list[RequestRecord], meta: dict[str, Any] | None = None) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_run_meta(
        run_dir,
        {"run_id": "test", "schema_version": "1.0", "bench_version": "0", "status": "complete", **(meta or {})},
    )
    w = RequestsWriter(run_dir, "test")
    for r in records:
        w.add_record(r)
    w.flush()
    return run_dir
