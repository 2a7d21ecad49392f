// OpenBLAS, loaded on first use. The CLI's commands that do not compute (version, replay, serve,
// disk verify, ...) never load it: loading it starts its thread pool and reserves its buffers,
// which under a tight ulimit -v made even `kvtier version` spin for ever.
//
// Thread-safety: LoadBlas() may be called from any thread (the first call loads); the wrappers
// load on first use too. Set the thread count before the first forward pass.
#ifndef KVTIER_ENGINE_BLAS_H_
#define KVTIER_ENGINE_BLAS_H_

#include <string>

#include "kvtier/status.h"

namespace kvtier::engine::blas {

// Loads libopenblas and resolves what the engine calls. Unavailable naming the library and the
// loader's reason when it cannot; the same status on every later call.
Status LoadBlas();

// True once LoadBlas() succeeded (nothing is loaded by asking).
bool BlasLoaded();

// C = alpha * A * op(B) + beta * C, row-major; op(B) = B^T when trans_b.
void Sgemm(bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
           int ldb, float beta, float* c, int ldc);
// y = alpha * A * x + beta * y, row-major A of m x n.
void Sgemv(int m, int n, float alpha, const float* a, int lda, const float* x, int incx, float beta,
           float* y, int incy);
void SetThreads(int threads);
int Threads();
// The kernel family OpenBLAS chose ("Haswell", "Prescott", ...), or "unavailable".
std::string CoreName();

}  // namespace kvtier::engine::blas

#endif  // KVTIER_ENGINE_BLAS_H_
