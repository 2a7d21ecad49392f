// Annotated mutexes: std::mutex and std::shared_mutex carry no capability attributes in
// libstdc++, so clang could not check KVTIER_GUARDED_BY against them. Every mutex in src/ is one
// of these, and every condition variable a CondVar over a Mutex, so -Wthread-safety sees every
// lock and every wait.
//
// TryLock hands the mutex to a MutexLock with std::adopt_lock. Waits are written as loops at the
// call site, where the analysis knows the mutex is held:
//   MutexLock lock(&mu_);
//   while (!ready_) cv_.Wait(&mu_);
//   while (!ready_) if (!cv_.WaitUntil(&mu_, deadline)) break;   // then check ready_ again
//
// Thread-safety: these are the synchronisation primitives.
#ifndef KVTIER_SRC_COMMON_MUTEX_H_
#define KVTIER_SRC_COMMON_MUTEX_H_

#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "common/clock.h"
#include "common/thread_annotations.h"

namespace kvtier {

class KVTIER_CAPABILITY("mutex") Mutex {
 public:
  void Lock() KVTIER_ACQUIRE() { mu_.lock(); }
  void Unlock() KVTIER_RELEASE() { mu_.unlock(); }
  // Takes the mutex when it is free (true, held) and returns false at once otherwise.
  bool TryLock() KVTIER_TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

class KVTIER_CAPABILITY("shared_mutex") SharedMutex {
 public:
  void Lock() KVTIER_ACQUIRE() { mu_.lock(); }
  void Unlock() KVTIER_RELEASE() { mu_.unlock(); }
  void LockShared() KVTIER_ACQUIRE_SHARED() { mu_.lock_shared(); }
  void UnlockShared() KVTIER_RELEASE_SHARED() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

class KVTIER_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) KVTIER_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  // Takes over a mutex the caller holds (after a successful TryLock) and unlocks it at the end:
  //   if (!mu_.TryLock()) return;
  //   MutexLock lock(&mu_, std::adopt_lock);
  MutexLock(Mutex* mu, std::adopt_lock_t) KVTIER_REQUIRES(mu) : mu_(mu) {}
  ~MutexLock() KVTIER_RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* mu_;
};

class KVTIER_SCOPED_CAPABILITY WriterLock {
 public:
  explicit WriterLock(SharedMutex* mu) KVTIER_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~WriterLock() KVTIER_RELEASE() { mu_->Unlock(); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  SharedMutex* mu_;
};

class KVTIER_SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(SharedMutex* mu) KVTIER_ACQUIRE_SHARED(mu) : mu_(mu) { mu_->LockShared(); }
  ~ReaderLock() KVTIER_RELEASE() { mu_->UnlockShared(); }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  SharedMutex* mu_;
};

// A condition variable over a Mutex the caller holds. Wakeups may be spurious: wait in a loop
// that re-checks the condition.
class CondVar {
 public:
  // Releases mu, sleeps until signalled, and takes mu again before returning.
  void Wait(Mutex* mu) KVTIER_REQUIRES(mu) {
    std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
    cv_.wait(l);
    l.release();  // the caller's lock still owns the mutex
  }
  // As Wait, until deadline at the latest: false when it passed.
  bool WaitUntil(Mutex* mu, MonotonicClock::time_point deadline) KVTIER_REQUIRES(mu) {
    std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
    const bool signalled = cv_.wait_until(l, deadline) == std::cv_status::no_timeout;
    l.release();
    return signalled;
  }
  // As Wait, for timeout at most: false when it passed.
  template <typename Rep, typename Period>
  bool WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> timeout) KVTIER_REQUIRES(mu) {
    std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
    const bool signalled = cv_.wait_for(l, timeout) == std::cv_status::no_timeout;
    l.release();
    return signalled;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace kvtier

#endif  // KVTIER_SRC_COMMON_MUTEX_H_
