"""Seeded, reproducible request streams: what to send and when."""

from bench_llm.workloads.spec import Message, RequestSpec, Schedule

__all__ = ["Message", "RequestSpec", "Schedule"]
