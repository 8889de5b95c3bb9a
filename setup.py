"""Builds bench's optional compiled read path; all other packaging is in pyproject.toml.

``loadgen/_fastpath.c`` is optional: where it cannot be compiled (no C compiler, not a
POSIX platform) the install still succeeds and bench uses its pure-Python read path,
which gives the same records (tests/loadgen/test_fastpath.py) at a higher CPU cost per token.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("bench_llm.loadgen._fastpath", ["loadgen/_fastpath.c"], optional=True, extra_compile_args=["-O2"]),
    ]
)
