"""bench: benchmark and load-test LLM inference engines."""

__version__ = "0.1.0"
