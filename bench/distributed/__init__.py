"""Distributed load generation: locust's master/worker runner carries the coordination.

Only ``locust_master`` and ``locust_worker`` import locust (gevent monkey-patches the
standard library at import). Everything else here is plain Python, and the measuring
itself happens in ``measure``, a separate asyncio process that never sees gevent.
See docs/distributed.md.
"""
