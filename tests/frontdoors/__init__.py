"""CPU tests of the front doors: flashgen.api and flashgen.torch (and the nanoGPT example)."""
