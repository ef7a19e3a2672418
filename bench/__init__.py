"""Benchmarks: scripts run as ``python bench/<name>.py``; ``bench.common`` is what they share."""
