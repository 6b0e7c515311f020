// device_has_wgmma (device.hpp).
#include "device.hpp"

namespace sieve::kernels::cuda::sm90 {

bool device_has_wgmma(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major == 9 && minor == 0;
}

}  // namespace sieve::kernels::cuda::sm90
