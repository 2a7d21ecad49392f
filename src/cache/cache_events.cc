// The Cache's KV-event publisher: started at open, fed by Emit (cache_impl.h).
#include "cache/cache_impl.h"

namespace kvtier {

std::string_view DefaultMedium(TierKind kind) {
  switch (kind) {
    case TierKind::kEmulatedDevice:
      return "GPU";
    case TierKind::kHost:
      return "CPU";
    case TierKind::kDisk:
      return "STORAGE";
    case TierKind::kRemote:
      return "REMOTE";
  }
  return "";
}

Status Cache::Impl::OpenEvents() {
  if (!options_.events.enabled()) return Status::Ok();
  events::PublisherSetup setup;
  setup.options = options_.events;
  setup.block_tokens = options_.layout.block_tokens;
  setup.model = options_.model_id;
  for (size_t i = 0; i < tiers_.size(); ++i) {
    const std::vector<std::string>& media = options_.events.media;
    setup.media.push_back(i < media.size() && !media[i].empty()
                              ? media[i]
                              : std::string(DefaultMedium(tiers_[i]->tier->kind())));
  }
  KVTIER_ASSIGN_OR_RETURN(publisher_, events::KvEventPublisher::Start(std::move(setup)));
  // The disk tier rebuilt its index from its files, but this Cache finds those blocks only when
  // a lookup asks: index them now, so that they are announced (after the publisher's
  // AllBlocksCleared) and their later eviction is announced too.
  for (auto& st : tiers_)
    for (const BlockKey& key : st->tier->RecoveredKeys())
      Emit(KvEvent::Type::kStored, key, st->index, index_.AddTier(key, st->index, 0));
  return Status::Ok();
}

void Cache::Impl::EmitCleared() {
  if (!Listened()) return;
  // The number first, then the snapshot: a change numbered before it is in the snapshot, one
  // numbered after it is delivered after it (at worst a block announced twice).
  KvEvent e;
  e.seq = index_.TakeChange();
  e.type = KvEvent::Type::kCleared;
  e.tier = -1;
  std::vector<std::pair<BlockKey, TierMask>> all;
  index_.Select([](const BlockKey&) { return true; }, &all);
  auto resident = std::make_shared<std::vector<KvEventBlock>>();
  for (const auto& [key, mask] : all)
    for (int t = 0; t < static_cast<int>(tiers_.size()); ++t)
      if (mask & (TierMask{1} << t))
        resident->push_back(KvEventBlock{key, t, engine_hashes_.Get(key)});
  e.resident = std::move(resident);
  Deliver(e);
}

KvEventsInfo Cache::events_info() const {
  KvEventsInfo info;
  const events::KvEventPublisher* p = impl_->publisher_.get();
  if (!p) return info;
  info.endpoint = p->endpoint();
  info.replay_endpoint = p->replay_endpoint();
  info.topic = p->topic();
  info.keys_topic = p->keys_topic();
  const events::PublisherStats s = p->stats();
  info.events = s.events;
  info.batches = s.batches;
  info.dropped = s.dropped;
  info.engine_hash_blocks = impl_->engine_hashes_.size();
  info.engine_hashes_dropped = impl_->engine_hashes_.dropped();
  return info;
}

}  // namespace kvtier
