"""CPU tests of flashgen.perf."""
