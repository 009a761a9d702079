"""CPU tests of flashgen.runtime."""
