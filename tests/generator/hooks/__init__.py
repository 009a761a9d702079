"""CPU tests of flashgen.generator.hooks (nvcc ones carry the compile_all marker)."""
