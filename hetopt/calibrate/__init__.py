"""Fitting the cost model to measurements: GEMM throughput, collectives, end-to-end runs, and the
A100 layer and iteration times; and measuring them on a local device. `hetopt calibrate` runs
these."""
