// OpenBLAS kernel selection. Debian's OpenBLAS is a DYNAMIC_ARCH build that picks its kernels
// from the CPU id at load time; under some hypervisors it falls back to the SSE3 "Prescott"
// kernels on a CPU that has AVX2/AVX-512 (4x slower sgemm here). The choice can only be made
// before the library loads, through OPENBLAS_CORETYPE, so the engine's CLI commands re-exec
// themselves once with it set. Bit-exactness is per process and thread count, so the kernel
// choice never mixes within one comparison.
//
// Thread-safety: call from main's thread before any other thread starts.
#ifndef KVTIER_ENGINE_BLAS_SETUP_H_
#define KVTIER_ENGINE_BLAS_SETUP_H_

#include <string>

namespace kvtier::engine {

// OpenBLAS's kernel family ("SkylakeX", "Haswell", "Prescott", ...).
std::string BlasCoreName();

// When OPENBLAS_CORETYPE is unset, OpenBLAS chose a pre-AVX2 kernel and the CPU has AVX2 (or
// AVX-512), sets OPENBLAS_CORETYPE to the matching kernel and re-executes the process with the
// same arguments (it does not return then). Set KVTIER_NO_BLAS_REEXEC=1 to keep the choice.
void ReexecWithFasterBlasIfNeeded();

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_BLAS_SETUP_H_
