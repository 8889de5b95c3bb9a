"""Fitting length tables from a trace, and regenerating the shipped built-in tables.

The built-in workloads ship only fitted figures (quantile tables and summary
statistics), never the raw traces. Regenerate them from the public traces with::

    python -m workloads.fit ../shared/traces

Percentiles use numpy's linear interpolation, the definition STATS.md uses, so the
figures are comparable with that study's.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from bench_llm.workloads.readers import TraceTable, read_trace

#: Marginal tables: 201 knots (every 0.5 %) so p5/p50/p95 are knots and tails are kept.
MARGINAL_PROBS = np.round(np.linspace(0.0, 1.0, 201), 6)
#: Joint tables: 20 input bins, each with a 101-knot table of output ranks.
JOINT_BIN_EDGES = np.round(np.linspace(0.0, 1.0, 21), 6)
JOINT_OUTPUT_PROBS = np.round(np.linspace(0.0, 1.0, 101), 6)

SUMMARY_QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95, 0.99)


def summarize(x: np.ndarray) -> dict[str, float]:
    """count, mean, std, min, max and the SUMMARY_QUANTILES (linear interpolation)."""
    x = np.asarray(x, dtype=float)
    out = {
        "count": int(x.size),
        "mean": round(float(x.mean()), 3),
        "std": round(float(x.std(ddof=1)), 3) if x.size > 1 else 0.0,
        "min": float(x.min()),
        "max": float(x.max()),
    }
    for q in SUMMARY_QUANTILES:
        out[f"p{round(q * 100):g}"] = round(float(np.percentile(x, q * 100)), 3)
    return out


def marginal_table(x: np.ndarray, probs: np.ndarray = MARGINAL_PROBS) -> dict[str, list[float]]:
    values = np.percentile(np.asarray(x, dtype=float), probs * 100)
    values = np.maximum.accumulate(np.round(values, 3))
    return {"probs": [float(p) for p in probs], "values": [float(v) for v in values]}


def rank_sums(x: np.ndarray) -> np.ndarray:
    """Twice each value's rank, tied values at the mean of their ranks (0-based ranks plus
    one half): the same whatever the input order, and whichever sort numpy picks (its unstable
    argsort orders ties differently on CPUs with AVX-512)."""
    s = np.sort(x)
    return np.searchsorted(s, x, side="left") + np.searchsorted(s, x, side="right")


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of ``a`` and ``b``, ties at their mid-ranks."""
    return float(np.corrcoef(rank_sums(a), rank_sums(b))[0, 1])


def joint_table(inputs: np.ndarray, outputs: np.ndarray) -> dict[str, object]:
    """Quantile tables of output ranks per input-quantile bin (see ``ConditionalPair``).

    Output ranks are mid-ranks scaled to (0, 1); input ties are broken by a stable sort.
    """
    n = len(inputs)
    order = np.argsort(inputs, kind="stable")
    ranks = rank_sums(outputs) / (2.0 * n)
    tables = []
    for lo, hi in zip(JOINT_BIN_EDGES[:-1], JOINT_BIN_EDGES[1:]):
        a = int(round(lo * n))
        idx = order[a : max(int(round(hi * n)), a + 1)]
        vals = np.percentile(ranks[idx], JOINT_OUTPUT_PROBS * 100)
        tables.append([round(float(v), 5) for v in np.maximum.accumulate(vals)])
    return {
        "bin_edges": [float(e) for e in JOINT_BIN_EDGES],
        "rank_probs": [float(p) for p in JOINT_OUTPUT_PROBS],
        "rank_values": tables,
    }


def fit_lengths(table: TraceTable, joint: bool) -> dict[str, object]:
    """The ``lengths`` section of a built-in workload file, fitted from ``table``."""
    i, o = table.input_tokens, table.output_tokens
    out: dict[str, object] = {
        "kind": "joint" if joint else "independent",
        "input": marginal_table(i),
        "summary": {"input": summarize(i), "output": summarize(o), "spearman": round(spearman(i, o), 3)},
    }
    out["output"] = marginal_table(o)
    if joint:
        out["joint"] = joint_table(i, o)
    return out


#: name -> (trace file under the shared traces folder, joint?, source, licence, description)
BUILTIN_SOURCES: dict[str, tuple[str, bool, str, str, str]] = {
    "chat": (
        "azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv",
        False,
        "Azure/AzurePublicDataset data/AzureLLMInferenceTrace_conv.csv (Azure LLM inference trace 2023, conversation)",
        "CC-BY-4.0",
        "Production chat requests (Azure 2023 conversation trace); lengths sampled independently (|r| <= 0.12).",
    ),
    "code": (
        "azure-llm-inference-2023/AzureLLMInferenceTrace_code.csv",
        False,
        "Azure/AzurePublicDataset data/AzureLLMInferenceTrace_code.csv (Azure LLM inference trace 2023, code)",
        "CC-BY-4.0",
        "Production code-completion requests (Azure 2023 code trace): long prompts, very short outputs.",
    ),
    "long-context": (
        "mooncake-fast25/conversation_trace.jsonl",
        False,
        "kvcache-ai/Mooncake FAST25-release/traces/conversation_trace.jsonl (Kimi conversation trace)",
        "Apache-2.0",
        "Long-context chat (Mooncake FAST'25 conversation trace), every request sharing a 512-token first block.",
    ),
    "sharegpt": (
        "sharegpt-sarathi-serve/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
        False,
        "microsoft/sarathi-serve data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
        "Apache-2.0",
        "ShareGPT, conversation-level variant (full history as prompt, <= 8k, Llama-2 tokenizer); "
        "not vLLM's first-turn-only ShareGPT sampling.",
    ),
    "arxiv-summarization": (
        "arxiv-summarization-vidur/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
        True,
        "microsoft/vidur data/processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
        "MIT",
        "arXiv summarisation (Llama-2 tokenizer, <= 4k); input and output sampled jointly (negatively correlated).",
    ),
}


def regenerate(traces_dir: Path, out_dir: Path) -> list[Path]:
    written = []
    for name, (rel, joint, source, licence, text) in BUILTIN_SOURCES.items():
        path = traces_dir / rel
        table = read_trace(path)
        doc = {
            "name": name,
            "description": text,
            "source": source,
            "licence": licence,
            "trace_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "fitted_by": "python -m workloads.fit (numpy percentile, linear interpolation)",
            "lengths": fit_lengths(table, joint),
        }
        target = out_dir / f"{name}.json"
        target.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
        written.append(target)
    return written


def main(argv: list[str]) -> int:
    traces = Path(argv[0]) if argv else Path("../shared/traces")
    out = Path(__file__).parent / "builtin"
    for p in regenerate(traces, out):
        print(f"wrote {p} ({p.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
