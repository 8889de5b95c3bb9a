"""The embedded simulated engine: speaks real engine APIs, paces tokens in real time."""
