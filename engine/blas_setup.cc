#include "engine/blas_setup.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <vector>

#include "engine/blas.h"

namespace kvtier::engine {

std::string BlasCoreName() { return blas::CoreName(); }

void ReexecWithFasterBlasIfNeeded() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  if (const char* no = std::getenv("KVTIER_NO_BLAS_REEXEC"); no != nullptr && *no && *no != '0') {
    return;
  }
  // Under an address-space limit the engine checks what it needs before OpenBLAS loads (its
  // thread buffers are counted); asking for the kernel name here would load it first.
  rlimit as{};
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) return;
  const std::string core = BlasCoreName();
  static const char* kOld[] = {"Prescott", "Core2",  "Penryn", "Dunnington", "Nehalem",
                               "Atom",     "Katmai", "Banias", "Northwood",  "Coppermine"};
  bool old = false;
  for (const char* o : kOld) old |= core == o;
  if (!old) return;
  __builtin_cpu_init();
  const char* want = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                     : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                       : nullptr;
  if (want == nullptr) return;
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), {});
  std::vector<std::string> args;
  for (size_t start = 0; start < all.size();) {
    const size_t end = all.find('\0', start);
    args.push_back(all.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (args.empty()) return;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fprintf(stderr,
               "kvtier: OpenBLAS chose its %s kernels on a CPU with %s; re-running with "
               "OPENBLAS_CORETYPE=%s (set it, or KVTIER_NO_BLAS_REEXEC=1, to skip this)\n",
               core.c_str(), want == std::string("SkylakeX") ? "AVX-512" : "AVX2", want);
  std::fflush(stderr);
  setenv("OPENBLAS_CORETYPE", want, 1);
  execv("/proc/self/exe", argv.data());
  unsetenv("OPENBLAS_CORETYPE");  // exec failed: carry on with the slow kernels
}

}  // namespace kvtier::engine
