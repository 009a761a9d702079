"""Emits kernels for other projects: a bundle folder (cubins or sources, a C header and
launcher with a C ABI, a CMake build and an example) written by `emit`."""
