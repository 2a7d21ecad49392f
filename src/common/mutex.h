// Annotated mutexes: std::mutex and std::shared_mutex carry no capability attributes in
// libstdc++, so clang could not check KVTIER_GUARDED_BY against them.
// Thread-safety: these are the synchronisation primitives.
#ifndef KVTIER_SRC_COMMON_MUTEX_H_
#define KVTIER_SRC_COMMON_MUTEX_H_

#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "common/thread_annotations.h"

namespace kvtier {

class KVTIER_CAPABILITY("mutex") Mutex {
 public:
  void Lock() KVTIER_ACQUIRE() { mu_.lock(); }
  void Unlock() KVTIER_RELEASE() { mu_.unlock(); }
  std::mutex& native() { return mu_; }

 private:
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

}  // namespace kvtier

#endif  // KVTIER_SRC_COMMON_MUTEX_H_
