"""Benchmarks: retrieval quality and speed (``python -m benchmarks.retrieval``)."""
