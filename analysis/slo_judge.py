"""The per-request SLO judge: which requests of a run met every bound of an SLO, and which
bound each missed (the sweep's points and the saturation guard read it)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from bench_llm.analysis.slo import SLO, SLO_METRICS


def slo_outcomes(df: pd.DataFrame, slo: SLO) -> dict[str, np.ndarray]:
    """Per request: ``met`` (completed and met every bound) and ``miss_<name>`` per bound.

    A request with fewer than two output tokens has no TPOT and is not judged on it; a
    request that did not complete misses everything it has no value for.
    """
    ok = df["ok"].to_numpy(dtype=bool)
    met = ok.copy()
    out: dict[str, np.ndarray] = {}
    for key, limit in slo.request_limits:
        col = df[SLO_METRICS[key]].to_numpy(dtype=float)
        no_value_ok = key in ("tpot_ms", "itl_max_ms")
        good = np.where(np.isnan(col), no_value_ok & ok, col <= limit)
        out[f"miss_{key}"] = ~good
        met &= good
    out["met"] = met
    return out
