"""Benchmark scripts; their figures go in docs/benchmarks.md."""
