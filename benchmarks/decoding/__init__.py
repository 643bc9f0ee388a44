"""Decoding benchmarks: STATIC against its baselines, measured in one run.

Run everything with `python benchmarks/run_all.py` (or `static-keras bench`);
each module also runs alone (`python -m benchmarks.decoding.decode_sweep`).
"""
