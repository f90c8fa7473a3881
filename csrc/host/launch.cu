// allow_dynamic_smem, resident_ctas and multiprocessors (host/launch.cuh): the per-device lookups every launcher
// shares.
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

int multiprocessors() {
  constexpr int kMaxDevices = 64;
  static int count[kMaxDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return 1;
  if (count[device] == 0) cudaDeviceGetAttribute(&count[device], cudaDevAttrMultiProcessorCount, device);
  return count[device] > 0 ? count[device] : 1;
}

}  // namespace omni
