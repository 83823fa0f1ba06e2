// cuBLASLt, opened on first use. Linking it costs every troupe process about 150 MB of resident memory
// at start (its static data, measured: a program linked against cudart alone holds 1.6 MB, with
// cublasLt 153 MB), which a CPU-only run, or a tool that never touches a GPU, should not pay. The
// executor calls these twelve functions; each resolves its symbol in the library the first time it is
// called. The library is not linked, so these definitions are the program's only ones, and the
// lookups, made in the library's own handle, find the library's.
#include <cublasLt.h>
#include <dlfcn.h>

#include <string>

namespace {

void* library() {
  static void* const handle = [] {
    void* h = ::dlopen("libcublasLt.so." TROUPE_CUBLASLT_SOVERSION, RTLD_NOW | RTLD_LOCAL);
    if (!h) h = ::dlopen((std::string(TROUPE_CUDA_LIBRARY_DIR) + "/libcublasLt.so." TROUPE_CUBLASLT_SOVERSION).c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) h = ::dlopen("libcublasLt.so", RTLD_NOW | RTLD_LOCAL);
    return h;
  }();
  return handle;
}

template <class F>
F resolve(const char* name) {
  void* h = library();
  return h ? reinterpret_cast<F>(::dlsym(h, name)) : nullptr;
}

}  // namespace

// Each forwards to the library's function, or reports the library missing as cuBLAS does an
// uninitialised handle.
#define TROUPE_CUBLASLT_FORWARD(name, params, args)                                  \
  cublasStatus_t CUBLASWINAPI name params {                                          \
    static const auto f = resolve<cublasStatus_t(CUBLASWINAPI*) params>(#name);      \
    return f ? f args : CUBLAS_STATUS_NOT_INITIALIZED;                               \
  }

extern "C" {
TROUPE_CUBLASLT_FORWARD(cublasLtCreate, (cublasLtHandle_t * h), (h))
TROUPE_CUBLASLT_FORWARD(cublasLtDestroy, (cublasLtHandle_t h), (h))
TROUPE_CUBLASLT_FORWARD(cublasLtMatmul,
                        (cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                         const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                         cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream),
                        (h, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace, workspace_bytes, stream))
TROUPE_CUBLASLT_FORWARD(cublasLtMatmulAlgoGetHeuristic,
                        (cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                         cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc, cublasLtMatmulPreference_t pref, int requested,
                         cublasLtMatmulHeuristicResult_t results[], int* returned),
                        (h, desc, Adesc, Bdesc, Cdesc, Ddesc, pref, requested, results, returned))
TROUPE_CUBLASLT_FORWARD(cublasLtMatmulDescCreate, (cublasLtMatmulDesc_t * desc, cublasComputeType_t compute, cudaDataType_t scale),
                        (desc, compute, scale))
TROUPE_CUBLASLT_FORWARD(cublasLtMatmulDescSetAttribute,
                        (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t bytes), (desc, attr, buf, bytes))
TROUPE_CUBLASLT_FORWARD(cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref), (pref))
TROUPE_CUBLASLT_FORWARD(cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref), (pref))
TROUPE_CUBLASLT_FORWARD(cublasLtMatmulPreferenceSetAttribute,
                        (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf, size_t bytes),
                        (pref, attr, buf, bytes))
TROUPE_CUBLASLT_FORWARD(cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))
TROUPE_CUBLASLT_FORWARD(cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))
TROUPE_CUBLASLT_FORWARD(cublasLtMatrixLayoutCreate, (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld),
                        (layout, type, rows, cols, ld))
}
