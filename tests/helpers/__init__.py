"""Shared test helpers: real CLI runs, DDP readiness, batching invariance, causality."""
