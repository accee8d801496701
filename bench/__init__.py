"""Benchmarks for cairnqd against the public cairnq SDK and Postgres peers.

Run the drivers as modules from the repository root (`python -m bench.drain ...`);
`bench/run_all.sh` runs them all. Worker processes are `bench/worker_proc.py` and
`bench/raw_proc.py`, started by the drivers.
"""
