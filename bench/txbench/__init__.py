"""What the benchmark scripts in bench/ share: workloads, contenders, timing, checks, output.

The scripts run as ``python bench/<script>.py``, which puts bench/ on ``sys.path``, so they
import this package as ``txbench``. Nothing here imports txstore at module level: a script may
first point the import at a frozen copy of the sources (bench_read.py does).
"""
