// allow_dynamic_smem, resident_ctas, multiprocessors and compute_capability (host/launch.cuh): the per-device lookups
// every launcher shares.
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "host/launch.cuh"
#include "host/status.cuh"

namespace omni {

int allow_dynamic_smem(const void* kernel, int bytes, const char* name) {
  int device = 0;
  if (int s = check_cuda(cudaGetDevice(&device), "cudaGetDevice")) return s;
  static std::mutex mutex;
  static std::set<std::pair<const void*, int>> allowed;
  std::lock_guard<std::mutex> lock(mutex);
  if (allowed.count({kernel, device})) return OMNI_OK;
  int max_bytes = 0;
  if (int s = check_cuda(cudaDeviceGetAttribute(&max_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
                         "cudaDeviceGetAttribute"))
    return s;
  if (bytes > max_bytes)
    return fail(OMNI_ERR_ARCH, "%s needs %d bytes of shared memory per block; device %d allows %d", name, bytes, device,
                max_bytes);
  if (int s = check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), name))
    return s;
  allowed.insert({kernel, device});
  return OMNI_OK;
}

int resident_ctas(const void* kernel, int threads, int smem_bytes, int* count) {
  int device = 0;
  if (int s = check_cuda(cudaGetDevice(&device), "cudaGetDevice")) return s;
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> known;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find({kernel, device});
  if (it == known.end()) {
    int n = 0;
    if (int s = check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem_bytes),
                           "cudaOccupancyMaxActiveBlocksPerMultiprocessor"))
      return s;
    it = known.emplace(std::make_pair(kernel, device), n > 0 ? n : 1).first;
  }
  *count = it->second;
  return OMNI_OK;
}

namespace {

constexpr int kMaxDevices = 64;

// The attribute `lookup` of the current device, asked once per device into `known` (0: not yet known or failed).
template <typename Lookup>
int per_device(int (&known)[kMaxDevices], Lookup lookup) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return 0;
  if (known[device] == 0) known[device] = lookup(device);
  return known[device];
}

}  // namespace

int multiprocessors() {
  static int count[kMaxDevices] = {};
  const int n = per_device(count, [](int device) {
    int value = 0;
    cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, device);
    return value;
  });
  return n > 0 ? n : 1;
}

int compute_capability() {
  static int capability[kMaxDevices] = {};
  return per_device(capability, [](int device) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
      return 0;
    return major * 10 + minor;
  });
}

}  // namespace omni
