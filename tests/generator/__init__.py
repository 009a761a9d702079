"""CPU tests of flashgen.generator."""
