// The Cache's background writer: lower-tier writes and promotions, in batches, off the
// caller's path; a bounded queue gives backpressure.
#include <unordered_set>

#include "cache/cache_impl.h"

namespace kvtier {
namespace {

// The batches of jobs[a] and of every later job not yet taken with the same targets, as one
// batch: one Put per tier. Jobs queued apart may carry one block twice (two hits queued its
// reuse write before the writer ran): it is kept once, so the tier is written once.
BlockBatch MergeJobs(std::vector<WriteJob>& jobs, size_t a, std::vector<bool>* taken) {
  BlockBatch batch;
  batch.now_s = jobs[a].batch.now_s;
  std::unordered_set<BlockKey> seen;  // from the second job on
  for (size_t c = a; c < jobs.size(); ++c) {
    if ((*taken)[c] || jobs[c].first_target != jobs[a].first_target ||
        jobs[c].last_target != jobs[a].last_target || jobs[c].victims_of != jobs[a].victims_of)
      continue;
    (*taken)[c] = true;
    const bool dedupe = c != a;
    if (dedupe && seen.empty()) seen.insert(batch.keys.begin(), batch.keys.end());
    const BlockBatch& b = jobs[c].batch;
    for (size_t i = 0; i < b.size(); ++i)
      if (!dedupe || seen.insert(b.keys[i]).second)
        batch.Add(b.keys[i], b.blocks[i], b.checksums[i], b.positions[i], b.prefix_tokens[i],
                  b.sessions[i], b.reuse[i]);
  }
  return batch;
}

}  // namespace

void Cache::Impl::RunJobs(std::vector<WriteJob>& jobs) {
  const uint64_t bb = options_.layout.bytes_per_block();
  // Read what is not staged: one Get per job and source tier.
  for (WriteJob& job : jobs) {
    const size_t n = job.batch.size();
    bool any = false;
    for (int8_t f : job.from) any |= f >= 0;
    if (!any) continue;
    std::vector<bool> keep(n, true);
    for (auto& st : tiers_) {
      std::vector<uint32_t> idx;
      for (uint32_t i = 0; i < n; ++i)
        if (job.from[i] == st->index) idx.push_back(i);
      if (idx.empty()) continue;
      std::vector<BlockKey> gk;
      for (uint32_t i : idx) gk.push_back(job.batch.keys[i]);
      std::vector<Status> gs(idx.size());
      std::vector<ConstBlock> got(idx.size());
      Status call;
      if (st->arena_host != nullptr) {
        // The job pins its blocks, so each stays in its arena slot until written: read in place
        // (page-aligned, so the disk tier writes it without a bounce copy either).
        std::vector<const std::byte*> at(gk.size());
        st->arena_host->Pointers(gk, at);
        for (size_t j = 0; j < gk.size(); ++j) {
          if (at[j] == nullptr)
            gs[j] = Status::NotFound("not in the arena");
          else
            got[j] = ConstBlock(at[j], bb);
        }
      } else {
        if (!job.IsStaged()) job.Stage(n, bb);
        std::vector<MutableBlock> out;
        for (size_t j = 0; j < idx.size(); ++j) {
          out.emplace_back(job.Slot(idx[j], bb), bb);
          got[j] = ConstBlock(out.back().data(), bb);
        }
        call = st->tier->Get(gk, out, gs);
      }
      for (size_t j = 0; j < idx.size(); ++j) {
        const uint32_t i = idx[j];
        Status s = call.ok() ? gs[j] : call;
        if (s.ok() && options_.verify_checksums && st->cache_verifies &&
            job.batch.checksums[i] != 0 && Checksum64(got[j]) != job.batch.checksums[i])
          s = Status::Corruption("block failed its checksum");
        if (s.ok()) {
          job.batch.blocks[i] = got[j];
          continue;
        }
        keep[i] = false;
        // A promotion's source may have dropped the block since; a pinned copy may not.
        if (!(job.promotion && s.code() == StatusCode::kNotFound))
          tiers_[job.first_target]->write_failures.fetch_add(1, std::memory_order_relaxed);
      }
    }
    BlockBatch kept;
    kept.now_s = job.batch.now_s;
    for (uint32_t i = 0; i < n; ++i)
      if (keep[i])
        kept.Add(job.batch.keys[i], job.batch.blocks[i], job.batch.checksums[i],
                 job.batch.positions[i], job.batch.prefix_tokens[i], job.batch.sessions[i],
                 job.batch.reuse[i]);
    job.batch = std::move(kept);
  }
  // Jobs with the same targets become one batch: one Put per tier.
  std::vector<bool> taken(jobs.size(), false);
  for (size_t a = 0; a < jobs.size(); ++a) {
    if (taken[a]) continue;
    const BlockBatch batch = MergeJobs(jobs, a, &taken);
    if (batch.size() == 0) continue;
    for (int t = jobs[a].first_target; t <= jobs[a].last_target; ++t) {
      TierState& st = *tiers_[t];
      std::vector<Status> results(batch.size());
      std::vector<PendingEvent> events;
      std::vector<WriteJob> down;
      uint32_t stored = 0;
      StoreToTier(st, batch, results, &stored, &events, &down);
      CountFailures(st, results);
      if (jobs[a].victims_of >= 0)
        tiers_[jobs[a].victims_of]->writebacks.fetch_add(stored, std::memory_order_relaxed);
      EmitAll(events);
      // Victims of a background write cascade here, in the same thread.
      if (!down.empty()) RunJobs(down);
    }
  }
  // The jobs' pins go with them: the source copies may be evicted again.
  jobs.clear();
}

void Cache::Impl::Dispatch(std::vector<WriteJob> jobs) {
  if (jobs.empty()) return;
  if (!async_ || InWriter()) {
    RunJobs(jobs);
    return;
  }
  for (WriteJob& job : jobs) Enqueue(std::move(job), /*wait=*/true);
}

WriteQueue::WriteQueue(size_t cap_blocks, Run run)
    : cap_(cap_blocks), run_(std::move(run)), thread_([this] { Loop(); }) {}

WriteQueue::~WriteQueue() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  work_cv_.SignalAll();
  thread_.join();
}

bool WriteQueue::Enqueue(WriteJob job, bool wait) {
  const size_t n = job.batch.size();
  {
    MutexLock lock(&mu_);
    // A job larger than the whole queue goes in once the queue is empty.
    if (!(queued_blocks_ == 0 || queued_blocks_ + n <= cap_)) {
      if (!wait) return false;
      waits_.fetch_add(1, std::memory_order_relaxed);
      while (!(queued_blocks_ == 0 || queued_blocks_ + n <= cap_)) space_cv_.Wait(&mu_);
    }
    queued_blocks_ += n;
    ++busy_jobs_;
    queue_.push_back(std::move(job));
  }
  work_cv_.Signal();
  return true;
}

void WriteQueue::Loop() {
  // Background priority: woken by a Store on a busy core, the writer took that core and ran
  // its copies before the Store could return (measured: +2..20 ms on a 32-block Store of a
  // loaded 2-core machine). SCHED_BATCH and nice 10 leave the core to the caller; a writer
  // that falls behind is bounded by the queue's backpressure. Failure leaves it as it was.
  sched_param sp{};
  (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 10);
  for (;;) {
    std::vector<WriteJob> jobs;
    size_t blocks = 0;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stop_) work_cv_.Wait(&mu_);
      if (queue_.empty()) return;  // stopping, and drained
      // Everything queued becomes one batch.
      while (!queue_.empty()) {
        blocks += queue_.front().batch.size();
        jobs.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    const size_t njobs = jobs.size();
    run_(jobs);
    {
      MutexLock lock(&mu_);
      queued_blocks_ -= blocks;
      busy_jobs_ -= njobs;
    }
    space_cv_.SignalAll();
  }
}

void WriteQueue::WaitIdle() {
  MutexLock lock(&mu_);
  while (busy_jobs_ != 0) space_cv_.Wait(&mu_);
}

void Cache::Impl::WaitForWrites() {
  if (writer_) writer_->WaitIdle();
}

}  // namespace kvtier
