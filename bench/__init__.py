"""Benchmarks: one script per question (`python -m bench.<name> --help`); results in bench/RESULTS.md."""
