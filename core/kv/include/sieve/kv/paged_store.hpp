// The core's paged KV stores, exposed only through the ABI's KV-store table.
#pragma once
#include "sieve/kv_store.h"

namespace sieve::kv {
// Paged store on host memory. Page pools are reserved address space (mmap, MAP_NORESERVE):
// memory is committed when a page is first written, and eviction returns it to the OS
// (madvise(MADV_DONTNEED) over every OS page the evicted KV pages cover completely).
const sieve_kv_store_api* paged_cpu_store_api();
// Paged store on a CUDA device; nullptr in a build without CUDA.
const sieve_kv_store_api* paged_cuda_store_api();
// The core's store "paged" as hosts choose it (ABI 1.1 table: descriptor, empty parameter schema,
// validate): its create dispatches on the config's device to the CPU or the CUDA store above.
const sieve_kv_store_api* paged_store_api();
}  // namespace sieve::kv
