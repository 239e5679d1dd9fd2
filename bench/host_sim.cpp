// A stand-in libcudart.so.13 for timing msa's host code on a machine without a GPU: every call
// succeeds at once, "device" memory is host memory, kernels never run, and a stream capture
// records the launches as kernel nodes (so a call's launch count shows). One H200-like device.
// MSA_HOST_SIM_COUNTS=1 prints each entry point's calls at exit, MSA_HOST_SIM_TRACE=1 each
// launch's kernel as it happens. The GPU suites run under it too: their host-side rules (the
// refusals, launch counts of captures) are checked, anything that reads a kernel's results fails.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cxxabi.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {
// MSA_HOST_SIM_COUNTS=1: at exit, each runtime entry point's call count (what the program asked
// of the real runtime, whose entry points cost host time there). The counters are never
// destroyed, so the exit handler reads live objects.
std::vector<std::pair<const char*, std::atomic<long>*>>& counters() {
  static auto* v = new std::vector<std::pair<const char*, std::atomic<long>*>>();
  return *v;
}
void print_counts() {
  for (const auto& [name, n] : counters())
    if (n->load() != 0) std::fprintf(stderr, "host_sim: %-56s %ld\n", name, n->load());
}
std::atomic<long>* new_counter(const char* name) {
  static const bool registered = [] {
    const char* e = std::getenv("MSA_HOST_SIM_COUNTS");
    if (e != nullptr && e[0] == '1') std::atexit(print_counts);
    return true;
  }();
  (void)registered;
  counters().push_back({name, new std::atomic<long>(0)});
  return counters().back().second;
}
#define CALLED()                                                    \
  static std::atomic<long>* const counter_ = new_counter(__func__);  \
  counter_->fetch_add(1, std::memory_order_relaxed)
std::atomic<long> g_launches{0};
thread_local long g_capture_start = 0;
struct FakeGraph { long kernels; };
int g_stream_tag, g_event_tag;

CUresult fake_encode_tiled(CUtensorMap* m, CUtensorMapDataType, cuuint32_t, void*,
                           const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                           const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                           CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  std::memset(m, 0, sizeof(*m));
  return CUDA_SUCCESS;
}
// The one device the stand-in reports (an H200's limits); every query reads it.
const cudaDeviceProp& device() {
  static const cudaDeviceProp p = [] {
    cudaDeviceProp d;
    std::memset(&d, 0, sizeof(d));
    std::strcpy(d.name, "host-only stand-in (no GPU)");
    d.major = 9;
    d.multiProcessorCount = 132;
    d.sharedMemPerBlockOptin = 232448;
    d.sharedMemPerMultiprocessor = 233472;
    d.sharedMemPerBlock = 49152;
    d.maxThreadsPerMultiProcessor = 2048;
    d.maxThreadsPerBlock = 1024;
    d.regsPerMultiprocessor = d.regsPerBlock = 65536;
    d.warpSize = 32;
    d.l2CacheSize = 60 << 20;
    d.totalGlobalMem = size_t(141) << 30;
    d.maxBlocksPerMultiProcessor = 32;
    d.maxGridSize[0] = 2147483647;
    d.maxGridSize[1] = d.maxGridSize[2] = 65535;
    d.cooperativeLaunch = 1;
    return d;
  }();
  return p;
}
// Kernel names by host stub (from the fatbinary's registrations), for MSA_HOST_SIM_TRACE=1: each
// launch's kernel, demangled and cut to its template name, one line on stderr.
std::mutex g_names_mutex;
std::unordered_map<const void*, std::string>& kernel_names() {
  static auto* m = new std::unordered_map<const void*, std::string>();
  return *m;
}
bool tracing() {
  static const bool on = [] {
    const char* e = std::getenv("MSA_HOST_SIM_TRACE");
    return e != nullptr && e[0] == '1';
  }();
  return on;
}
void count_launch(const void* func) {
  g_launches.fetch_add(1, std::memory_order_relaxed);
  if (!tracing()) return;
  std::string name = "?";
  {
    std::lock_guard<std::mutex> lock(g_names_mutex);
    if (const auto it = kernel_names().find(func); it != kernel_names().end()) name = it->second;
  }
  int status = 0;
  char* d = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  std::string shown = status == 0 && d != nullptr ? d : name;
  std::free(d);
  if (const size_t lt = shown.find('<'); lt != std::string::npos) shown.resize(lt);
  std::fprintf(stderr, "host_sim: launch %s\n", shown.c_str());
}
}  // namespace

extern "C" {
void** __cudaRegisterFatBinary(void*) {
  CALLED();
  static void* h = nullptr;
  return &h;
}
void __cudaRegisterFatBinaryEnd(void**) {
  CALLED();
}
void __cudaUnregisterFatBinary(void**) {
  CALLED();
}
void __cudaRegisterFunction(void**, const char* host_fun, char*, const char* device_name, int,
                            uint3*, uint3*, dim3*, dim3*, int*) {
  CALLED();
  std::lock_guard<std::mutex> lock(g_names_mutex);
  kernel_names()[host_fun] = device_name;
}
void __cudaRegisterVar(void**, char*, char*, const char*, int, size_t, int, int) {
  CALLED();
}
unsigned __cudaPushCallConfiguration(dim3, dim3, size_t, struct CUstream_st*) {
  CALLED();
  return 0;
}
cudaError_t __cudaPopCallConfiguration(dim3* g, dim3* b, size_t* s, void* st) {
  CALLED();
  *g = dim3(1); *b = dim3(1); *s = 0; *static_cast<void**>(st) = nullptr;
  return cudaSuccess;
}
cudaError_t __cudaGetKernel(cudaKernel_t* k, const void* f) {  // the stub as handle
  CALLED();
  *k = reinterpret_cast<cudaKernel_t>(const_cast<void*>(f));
  return cudaSuccess;
}
cudaError_t __cudaLaunchKernel(cudaKernel_t k, dim3, dim3, void**, size_t, cudaStream_t) {
  CALLED();
  count_launch(reinterpret_cast<const void*>(k));
  return cudaSuccess;
}
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t*, const void* func, void**) {
  CALLED();
  count_launch(func);
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* n) {
  CALLED();
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  CALLED();
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int) {
  CALLED();
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  CALLED();
  *v = 13000;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  CALLED();
  *v = 13000;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int) {
  CALLED();
  const cudaDeviceProp& p = device();
  switch (a) {
    case cudaDevAttrMultiProcessorCount: *v = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *v = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *v = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = int(p.sharedMemPerBlockOptin); break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = int(p.sharedMemPerMultiprocessor); break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = int(p.sharedMemPerBlock); break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *v = p.maxThreadsPerMultiProcessor; break;
    case cudaDevAttrMaxThreadsPerBlock: *v = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxRegistersPerMultiprocessor: *v = p.regsPerMultiprocessor; break;
    case cudaDevAttrMaxRegistersPerBlock: *v = p.regsPerBlock; break;
    case cudaDevAttrL2CacheSize: *v = p.l2CacheSize; break;
    case cudaDevAttrWarpSize: *v = p.warpSize; break;
    case cudaDevAttrMaxGridDimX: *v = p.maxGridSize[0]; break;
    case cudaDevAttrMaxGridDimY: *v = p.maxGridSize[1]; break;
    case cudaDevAttrMaxGridDimZ: *v = p.maxGridSize[2]; break;
    case cudaDevAttrMaxBlocksPerMultiprocessor: *v = p.maxBlocksPerMultiProcessor; break;
    case cudaDevAttrCooperativeLaunch: *v = p.cooperativeLaunch; break;
    default: *v = 0;
  }
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  CALLED();
  *p = device();
  return cudaSuccess;
}
cudaError_t cudaGetDriverEntryPointByVersion(const char* name, void** f, unsigned int,
                                             unsigned long long,
                                             cudaDriverEntryPointQueryResult* q) {
  CALLED();
  if (std::strcmp(name, "cuTensorMapEncodeTiled") == 0) {
    *f = reinterpret_cast<void*>(&fake_encode_tiled);
    if (q) *q = cudaDriverEntryPointSuccess;
    return cudaSuccess;
  }
  *f = nullptr;
  if (q) *q = cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) {
  CALLED();
  return cudaSuccess;
}
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, const void*) {
  CALLED();
  std::memset(a, 0, sizeof(*a));
  a->maxThreadsPerBlock = 1024; a->numRegs = 64; a->binaryVersion = 90; a->ptxVersion = 90;
  a->maxDynamicSharedSizeBytes = int(device().sharedMemPerBlockOptin);
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* n, const void*, int, size_t,
                                                                  unsigned int) {
  CALLED();
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t n) {
  CALLED();
  *p = std::aligned_alloc(256, ((n + 255) / 256) * 256 + 256);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void* p) {
  CALLED();
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t) {
  CALLED();
  if (n) std::memmove(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* d, int v, size_t n, cudaStream_t) {
  CALLED();
  if (n) std::memset(d, v, n);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  CALLED();
  *s = reinterpret_cast<cudaStream_t>(&g_stream_tag);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t) {
  CALLED();
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  CALLED();
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  CALLED();
  *e = reinterpret_cast<cudaEvent_t>(&g_event_tag);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t) {
  CALLED();
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) {
  CALLED();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) {
  CALLED();
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  CALLED();
  *ms = 0.001f;
  return cudaSuccess;
}
cudaError_t cudaGetLastError() {
  CALLED();
  return cudaSuccess;
}
cudaError_t cudaPeekAtLastError() {
  CALLED();
  return cudaSuccess;
}
const char* cudaGetErrorString(cudaError_t) {
  CALLED();
  return "host-only stand-in runtime";
}
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
  CALLED();
  g_capture_start = g_launches.load();
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* g) {
  CALLED();
  *g = reinterpret_cast<cudaGraph_t>(new FakeGraph{g_launches.load() - g_capture_start});
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  CALLED();
  delete reinterpret_cast<FakeGraph*>(g);
  return cudaSuccess;
}
cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t* nodes, size_t* n) {
  CALLED();
  const long k = reinterpret_cast<FakeGraph*>(g)->kernels;
  if (nodes == nullptr) { *n = size_t(k); return cudaSuccess; }
  for (size_t i = 0; i < *n && long(i) < k; ++i)
    nodes[i] = reinterpret_cast<cudaGraphNode_t>(i + 1);
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long) {
  CALLED();
  *e = reinterpret_cast<cudaGraphExec_t>(new FakeGraph{reinterpret_cast<FakeGraph*>(g)->kernels});
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t) {
  CALLED();
  g_launches.fetch_add(reinterpret_cast<FakeGraph*>(e)->kernels, std::memory_order_relaxed);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
  CALLED();
  delete reinterpret_cast<FakeGraph*>(e);
  return cudaSuccess;
}
cudaError_t cudaGraphNodeGetType(cudaGraphNode_t, cudaGraphNodeType* t) {
  CALLED();
  *t = cudaGraphNodeTypeKernel;
  return cudaSuccess;
}
}  // extern "C"
