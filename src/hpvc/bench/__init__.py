"""Benchmarks: each writes results.json (every sample) and a report."""
