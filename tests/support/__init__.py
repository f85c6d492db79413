"""Helpers used only by the tests and the benchmarks."""
