#include "engine/blas.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace kvtier::engine::blas {
namespace {

// CBLAS's enum values (cblas.h), fixed by the CBLAS standard.
constexpr int kRowMajor = 101;
constexpr int kNoTrans = 111;
constexpr int kTrans = 112;

using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                         float, float*, int);
using SgemvFn = void (*)(int, int, int, int, float, const float*, int, const float*, int, float,
                         float*, int);
using SetThreadsFn = void (*)(int);
using GetThreadsFn = int (*)();
using CoreNameFn = char* (*)();

struct Api {
  Status status;
  SgemmFn sgemm = nullptr;
  SgemvFn sgemv = nullptr;
  SetThreadsFn set_threads = nullptr;
  GetThreadsFn get_threads = nullptr;
  CoreNameFn core_name = nullptr;
};

Api Load() {
  Api api;
  // The SONAME Debian's libopenblas0 installs (an alternative among its builds), then the
  // development link name.
  const char* kNames[] = {"libopenblas.so.0", "libopenblas.so"};
  void* lib = nullptr;
  std::string why;
  for (const char* name : kNames) {
    lib = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) break;
    const char* e = ::dlerror();
    why += std::string(why.empty() ? "" : "; ") + (e ? e : name);
  }
  if (lib == nullptr) {
    api.status = Status::Unavailable("engine: cannot load OpenBLAS (" + why +
                                     "): install libopenblas0 (scripts/bootstrap does)");
    return api;
  }
  const auto sym = [&](const char* name) {
    void* p = ::dlsym(lib, name);
    if (p == nullptr && api.status.ok()) {
      api.status = Status::Unavailable(std::string("engine: OpenBLAS lacks ") + name);
    }
    return p;
  };
  api.sgemm = reinterpret_cast<SgemmFn>(sym("cblas_sgemm"));
  api.sgemv = reinterpret_cast<SgemvFn>(sym("cblas_sgemv"));
  api.set_threads = reinterpret_cast<SetThreadsFn>(sym("openblas_set_num_threads"));
  api.get_threads = reinterpret_cast<GetThreadsFn>(sym("openblas_get_num_threads"));
  api.core_name = reinterpret_cast<CoreNameFn>(sym("openblas_get_corename"));
  return api;
}

std::once_flag g_once;
const Api* g_api = nullptr;

const Api& Get() {
  std::call_once(g_once, [] { g_api = new Api(Load()); });
  return *g_api;
}

// A forward pass cannot fail softly; the engine's Create checks LoadBlas() first, so reaching
// this means a Model was used directly without it.
const Api& Need() {
  const Api& api = Get();
  if (!api.status.ok()) {
    std::fprintf(stderr, "kvtier: %s\n", api.status.ToString().c_str());
    std::abort();
  }
  return api;
}

}  // namespace

Status LoadBlas() { return Get().status; }

bool BlasLoaded() { return g_api != nullptr && g_api->status.ok(); }

void Sgemm(bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
           int ldb, float beta, float* c, int ldc) {
  Need().sgemm(kRowMajor, kNoTrans, trans_b ? kTrans : kNoTrans, m, n, k, alpha, a, lda, b, ldb,
               beta, c, ldc);
}

void Sgemv(int m, int n, float alpha, const float* a, int lda, const float* x, int incx, float beta,
           float* y, int incy) {
  Need().sgemv(kRowMajor, kNoTrans, m, n, alpha, a, lda, x, incx, beta, y, incy);
}

void SetThreads(int threads) { Need().set_threads(threads); }

int Threads() { return Need().get_threads(); }

std::string CoreName() {
  const Api& api = Get();
  if (!api.status.ok()) return "unavailable";
  const char* name = api.core_name();
  return name ? name : "unknown";
}

}  // namespace kvtier::engine::blas
