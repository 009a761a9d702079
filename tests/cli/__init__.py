"""CPU tests of flashgen.cli."""
