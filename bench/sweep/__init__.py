"""Sweeps: launch an engine at each parallel configuration, measure it at several loads,
find its capacity under the SLOs, and recommend the smallest configuration (docs/sweeps.md).

Modules: ``spec`` (the definition, flags and TOML), ``matrix`` (cells and skip reasons),
``engines`` (launching, prefix-cache reset, health), ``loads`` (one measured load),
``cell`` (one cell), ``orchestrate`` (the whole sweep, resume), ``store`` (the folder).
"""
