"""Proves kernels: float64 oracles (`oracle`, `oracle_bwd`), a row-by-row reference
(`rowref`), and the property suite's cases and Hypothesis strategies (`checks`,
`strategies`). Imports `flashgen.runtime` and `flashgen.generator` below it."""
