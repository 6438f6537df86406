"""The rmqstore command-line tool."""

import os

# One OpenBLAS thread in every process the command line runs, unless set: numpy starts a
# thread per core at its import, which then spins a while waiting for work, and no rmqstore
# command does any linear algebra (the store's numpy is frombuffer, sort, take). Set here,
# before any of the package's modules imports numpy; the processes a command starts (the
# demo's nodes, Spark's workers) inherit it. benchmarks/CI.md, "Ninth round".
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
