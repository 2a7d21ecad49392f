// Clang thread-safety annotations (checked with -Wthread-safety; no-ops elsewhere).
#ifndef KVTIER_SRC_COMMON_THREAD_ANNOTATIONS_H_
#define KVTIER_SRC_COMMON_THREAD_ANNOTATIONS_H_

#if defined(__clang__)
#define KVTIER_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define KVTIER_THREAD_ANNOTATION_(x)
#endif

#define KVTIER_CAPABILITY(x) KVTIER_THREAD_ANNOTATION_(capability(x))
#define KVTIER_SCOPED_CAPABILITY KVTIER_THREAD_ANNOTATION_(scoped_lockable)
#define KVTIER_GUARDED_BY(x) KVTIER_THREAD_ANNOTATION_(guarded_by(x))
#define KVTIER_PT_GUARDED_BY(x) KVTIER_THREAD_ANNOTATION_(pt_guarded_by(x))
#define KVTIER_REQUIRES(...) KVTIER_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define KVTIER_REQUIRES_SHARED(...) \
  KVTIER_THREAD_ANNOTATION_(requires_shared_capability(__VA_ARGS__))
#define KVTIER_ACQUIRE(...) KVTIER_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define KVTIER_ACQUIRE_SHARED(...) KVTIER_THREAD_ANNOTATION_(acquire_shared_capability(__VA_ARGS__))
#define KVTIER_RELEASE(...) KVTIER_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define KVTIER_RELEASE_SHARED(...) KVTIER_THREAD_ANNOTATION_(release_shared_capability(__VA_ARGS__))
#define KVTIER_RELEASE_GENERIC(...) \
  KVTIER_THREAD_ANNOTATION_(release_generic_capability(__VA_ARGS__))
#define KVTIER_TRY_ACQUIRE(...) KVTIER_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
#define KVTIER_EXCLUDES(...) KVTIER_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define KVTIER_NO_THREAD_SAFETY_ANALYSIS KVTIER_THREAD_ANNOTATION_(no_thread_safety_analysis)

#endif  // KVTIER_SRC_COMMON_THREAD_ANNOTATIONS_H_
