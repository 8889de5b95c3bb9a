"""Per-kind metrics: structured output, embeddings, and the per-model split of a model mix
(docs/metrics.md, Request kinds). Each part appears only where some request was of its kind."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

#: The requests-table columns these metrics read (absent in runs written before them).
KIND_COLUMNS = ("kind", "model", "structured_ok", "inputs", "tool_calls", "first_tool_call_ns", "images")


def kinds_summary(counted: pd.DataFrame, window_s: float) -> dict[str, Any]:
    """``counted``: the measured, judged requests (failed ones included), with their latency
    metrics; ``window_s``: the run's measurement window (for rates)."""
    out: dict[str, Any] = {}
    ok = counted[counted["ok"].to_numpy(dtype=bool)]
    if "structured_ok" in ok:
        judged = ok["structured_ok"].dropna()
        if len(judged):
            fit = int(judged.astype(bool).sum())
            out["structured"] = {"requests": len(judged), "conforming": fit, "share": fit / len(judged)}
    if "kind" in ok and ok["kind"].eq("embeddings").any():
        out["embeddings"] = _embeddings(ok[ok["kind"].eq("embeddings")], window_s)
    if "tool_calls" in ok and ok["tool_calls"].notna().any():
        out["tools"] = _tools(ok[ok["tool_calls"].notna()])
    if "images" in ok and ok["images"].notna().any():
        with_images = ok[ok["images"].notna()]
        n = with_images["images"].astype("float64")
        extra = with_images["prompt_tokens"].astype("float64") - with_images["input_tokens_target"].astype("float64")
        out["images"] = {"requests": len(with_images), "images": int(n.sum()),
                         "prompt_tokens_mean": float(with_images["prompt_tokens"].astype("float64").mean()),
                         "image_tokens_per_image": float((extra / n).mean())}
    if "model" in counted and counted["model"].notna().any():
        out["models"] = {str(m): _model(g) for m, g in counted.groupby(counted["model"].fillna("(run's model)"))}
    return out


def _p(values: pd.Series, q: float) -> float:
    v = values.dropna().to_numpy(dtype=float)
    return float(np.percentile(v, q)) if len(v) else float("nan")


def _embeddings(emb: pd.DataFrame, window_s: float) -> dict[str, Any]:
    per = max(window_s, 1e-9)
    inputs = emb["inputs"].fillna(1).astype(int)
    by_batch = {}
    for size, g in emb.groupby(inputs):
        by_batch[int(size)] = {"requests": len(g), "e2e_ms_p50": _p(g["e2e_ms"], 50), "e2e_ms_p99": _p(g["e2e_ms"], 99)}
    prompt = emb["prompt_tokens"].astype("float64")
    return {
        "requests": len(emb),
        "inputs": int(inputs.sum()),
        "requests_per_s": len(emb) / per,
        "inputs_per_s": float(inputs.sum()) / per,
        "prompt_tokens_per_s": float(prompt.fillna(0).sum()) / per,
        "by_batch": by_batch,
    }


def _tools(with_tools: pd.DataFrame) -> dict[str, Any]:
    calls = with_tools["tool_calls"].astype(int)
    ttftc = (with_tools["first_tool_call_ns"].astype("float64") - with_tools["send_ns"].astype("float64")) / 1e6
    return {"requests": len(with_tools), "calling": int((calls > 0).sum()), "tool_calls": int(calls.sum()),
            "ttftc_ms_p50": _p(ttftc, 50), "ttftc_ms_p99": _p(ttftc, 99)}


def _model(g: pd.DataFrame) -> dict[str, Any]:
    ok = g[g["ok"].to_numpy(dtype=bool)]
    return {"requests": len(g), "ok": len(ok), "ttft_ms_p50": _p(ok["ttft_ms"], 50), "ttft_ms_p99": _p(ok["ttft_ms"], 99),
            "tpot_ms_p50": _p(ok["tpot_ms"], 50), "e2e_ms_p50": _p(ok["e2e_ms"], 50),
            "output_tokens": int(ok["output_tokens"].sum())}


def kinds_lines(k: dict[str, Any]) -> list[str]:
    """The summary's text lines for ``kinds_summary``'s result."""
    lines = []
    st = k.get("structured")
    if st:
        lines.append(f"structured output: {st['conforming']}/{st['requests']} answers conform "
                     f"({st['share']:.1%}; parse as JSON and fit the schema, match the regex, or equal a choice)")
    emb = k.get("embeddings")
    if emb:
        sizes = "; ".join(f"batch {b}: {v['requests']} req, E2E p50 {v['e2e_ms_p50']:.1f} ms p99 {v['e2e_ms_p99']:.1f} ms"
                          for b, v in sorted(emb["by_batch"].items()))
        lines.append(f"embeddings: {emb['requests']} requests, {emb['inputs_per_s']:,.1f} inputs/s, "
                     f"{emb['prompt_tokens_per_s']:,.0f} prompt tok/s ({sizes}); no TTFT (one response)")
    im = k.get("images")
    if im:
        lines.append(f"images: {im['requests']} requests carried {im['images']} images; server prompt tokens "
                     f"{im['prompt_tokens_mean']:.0f} per request, about {im['image_tokens_per_image']:.0f} per image "
                     "(server count minus the requested text length)")
    tl = k.get("tools")
    if tl:
        lines.append(f"tool calls: {tl['calling']}/{tl['requests']} requests with tools called one "
                     f"({tl['tool_calls']} calls); time to first tool-call token p50 {tl['ttftc_ms_p50']:.1f} ms "
                     f"p99 {tl['ttftc_ms_p99']:.1f} ms")
    for name, m in (k.get("models") or {}).items():
        lines.append(f"model {name}: {m['ok']}/{m['requests']} ok, TTFT p50 {m['ttft_ms_p50']:.1f} ms "
                     f"p99 {m['ttft_ms_p99']:.1f} ms, TPOT p50 {m['tpot_ms_p50']:.2f} ms, E2E p50 {m['e2e_ms_p50']:.1f} ms")
    return lines
