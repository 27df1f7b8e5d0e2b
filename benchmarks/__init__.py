"""Benchmark programs (not tests): each saves JSON, PNG plots and a Markdown summary under
``reports/bench/<time>/`` and prints a table. ``python -m benchmarks.run_all`` regenerates everything."""
