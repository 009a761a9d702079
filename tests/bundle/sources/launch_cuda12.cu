// A bundle's launcher compiled as against a CUDA 12.4 runtime, older than the 12.5 that brought
// cudaGetDriverEntryPointByVersion: the launcher must then look cuTensorMapEncodeTiled up with
// cudaGetDriverEntryPoint (the stand-ins check which, under MOCK_ENTRY_API=legacy). nvcc has
// already included cuda_runtime.h, whose include guard keeps this version.
#include <cuda_runtime.h>
#undef CUDART_VERSION
#define CUDART_VERSION 12040
#include "flashgen_launch.cu"
