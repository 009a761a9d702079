"""Runs kernels: the CUDA driver binding and the one launch path (`launch`), argument and
layout validation (`validate`), the PyCUDA host (`gpu`: device arrays, compile for the GPU in
use, launch), the backward's host side (`backward`) and the Hopper tensor maps (`tma`).
Imports only `flashgen.generator` below it."""
