"""The on-disk contract: versioned Parquet tables, written incrementally."""

from bench_llm.results.record import RequestRecord
from bench_llm.results.schema import REQUESTS_SCHEMA, RUN_SCHEMA, SCHEMA_VERSION

__all__ = ["REQUESTS_SCHEMA", "RUN_SCHEMA", "SCHEMA_VERSION", "RequestRecord"]
