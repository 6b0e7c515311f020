#include "sieve/runtime/layer_graph.hpp"

#ifdef SIEVE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace sieve::runtime {

LayerGraphs::LayerGraphs(int32_t n_layers) : layers_(size_t(n_layers > 0 ? n_layers : 0)) {}

LayerGraphs::~LayerGraphs() {
  for (Layer& l : layers_) drop(l);
}

#ifdef SIEVE_WITH_CUDA

namespace {
std::string cuda_line(const char* call, cudaError_t e) {
  return std::string(call) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}
}  // namespace

bool LayerGraphs::available() { return true; }

void LayerGraphs::drop(Layer& l) {
  // An executable graph still running is freed when it completes (cudaGraphExecDestroy).
  if (l.exec) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(l.exec));
  l.exec = nullptr;
  l.key.clear();
}

bool LayerGraphs::replay(int32_t layer, const std::vector<int64_t>& key, void* stream, sieve_status* status,
                         std::string* error) {
  Layer& l = layers_.at(size_t(layer));
  if (!l.exec || l.key != key) return false;
  *status = SIEVE_OK;
  if (cudaError_t e = cudaGraphLaunch(static_cast<cudaGraphExec_t>(l.exec), static_cast<cudaStream_t>(stream));
      e != cudaSuccess) {
    *status = SIEVE_ERR_DEVICE;
    if (error) *error = "runtime: layer " + std::to_string(layer) + ": " + cuda_line("cudaGraphLaunch", e);
    drop(l);
  }
  ++counts_.replays;
  return true;
}

sieve_status LayerGraphs::capture(int32_t layer, const std::vector<int64_t>& key, void* stream,
                                  const std::function<sieve_status(std::string*)>& work, std::string* error) {
  Layer& l = layers_.at(size_t(layer));
  const auto s = static_cast<cudaStream_t>(stream);
  auto failed = [&](const std::string& msg) {
    if (error) *error = "runtime: layer " + std::to_string(layer) + ", CUDA graph: " + msg;
    drop(l);
    return SIEVE_ERR_DEVICE;
  };
  // Thread-local mode: a hook that synchronises or allocates on this thread fails instead of
  // being silently left out of the graph.
  if (cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal); e != cudaSuccess)
    return failed(cuda_line("cudaStreamBeginCapture", e));
  std::string work_error;
  const sieve_status st = work(&work_error);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  if (st != SIEVE_OK || end != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();  // an invalidated capture leaves its error to be read once
    drop(l);
    if (st != SIEVE_OK) {
      if (error) *error = work_error;
      return st;
    }
    return failed(cuda_line("capturing the layer's hooks (a hook synchronised, allocated or used another stream?)", end));
  }
  bool updated = false;
  if (l.exec) {
    cudaGraphExecUpdateResultInfo info{};
    updated = cudaGraphExecUpdate(static_cast<cudaGraphExec_t>(l.exec), graph, &info) == cudaSuccess;
    if (!updated) {
      cudaGetLastError();
      drop(l);
    }
  }
  if (!updated) {
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0ULL);
    if (e != cudaSuccess) {
      cudaGraphDestroy(graph);
      return failed(cuda_line("cudaGraphInstantiate", e));
    }
    l.exec = exec;
  }
  cudaGraphDestroy(graph);  // the executable graph keeps what it needs
  l.key = key;
  ++counts_.captures;
  if (updated) ++counts_.updates;
  if (cudaError_t e = cudaGraphLaunch(static_cast<cudaGraphExec_t>(l.exec), s); e != cudaSuccess)
    return failed(cuda_line("cudaGraphLaunch", e));
  return SIEVE_OK;
}

#else  // no CUDA in this build: never asked to capture (available() is false)

bool LayerGraphs::available() { return false; }
void LayerGraphs::drop(Layer& l) { l.key.clear(); }
bool LayerGraphs::replay(int32_t, const std::vector<int64_t>&, void*, sieve_status*, std::string*) { return false; }
sieve_status LayerGraphs::capture(int32_t, const std::vector<int64_t>&, void*,
                                  const std::function<sieve_status(std::string*)>&, std::string* error) {
  if (error) *error = "runtime: CUDA graphs need a build with CUDA";
  return SIEVE_ERR_UNSUPPORTED;
}

#endif

}  // namespace sieve::runtime
