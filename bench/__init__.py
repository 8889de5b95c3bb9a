"""bench: the command line and the sweep orchestration, on top of every layer (docs/architecture.md)."""
