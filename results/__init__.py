"""The on-disk contract: versioned Parquet tables, written incrementally."""

from results.record import RequestRecord
from results.schema import REQUESTS_SCHEMA, RUN_SCHEMA, SCHEMA_VERSION

__all__ = ["REQUESTS_SCHEMA", "RUN_SCHEMA", "SCHEMA_VERSION", "RequestRecord"]
