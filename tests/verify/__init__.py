"""CPU tests of flashgen.verify."""
