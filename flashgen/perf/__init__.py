"""Measures kernels: the benchmark protocol (`bench`, `bench_features`), tuning (`tune`),
SASS instruction mixes (`sass`), memory traffic (`traffic`) and occupancy (`occupancy`).
Times the front doors (`flashgen.api`, `flashgen.torch`) as users call them."""
