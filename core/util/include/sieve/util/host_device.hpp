// SIEVE_HD: a small function compiled for both sides — __host__ __device__ and force-inlined under
// nvcc, plain inline in a C++ translation unit — so one header of arithmetic serves a CPU path and
// the CUDA kernels of the same method.
#pragma once

#if defined(__CUDACC__)
#define SIEVE_HD __host__ __device__ __forceinline__
#else
#define SIEVE_HD inline
#endif
