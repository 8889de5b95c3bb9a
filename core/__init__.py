"""The bottom layer: what every layer of bench may import, and which imports none of them.

Config loading (``core.config``), the click-free error base (``core.errors``), the event
loop runner (``core.eventloop``), the engine-control client (``core.control``) and the
deterministic tokenizer (``core.tokenizer``). docs/architecture.md draws the layers;
tests/whole/test_layering.py enforces them.
"""

#: bench's version, written here only (pyproject.toml reads it from this line).
__version__ = "0.1.0"
