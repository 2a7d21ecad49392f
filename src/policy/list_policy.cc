#include "policy/list_policy.h"

namespace kvtier {

uint32_t ListPolicyBase::NewNode(const BlockKey& key, int l) {
  uint32_t n;
  if (!free_nodes_.empty()) {
    n = free_nodes_.back();
    free_nodes_.pop_back();
    nodes_[n] = Node{};
  } else {
    n = static_cast<uint32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  nodes_[n].key = key;
  map_.Insert(key, n);
  PushFront(n, l);
  return n;
}

void ListPolicyBase::FreeNode(uint32_t n) {
  Unlink(n);
  map_.Erase(nodes_[n].key, n);
  free_nodes_.push_back(n);
}

void ListPolicyBase::PushFront(uint32_t n, int l) {
  Node& x = nodes_[n];
  List& L = lists_[l];
  x.list = static_cast<uint8_t>(l);
  x.prev = kNil;
  x.next = L.head;
  if (L.head != kNil) nodes_[L.head].prev = n;
  L.head = n;
  if (L.tail == kNil) L.tail = n;
  ++L.size;
}

void ListPolicyBase::Unlink(uint32_t n) {
  Node& x = nodes_[n];
  List& L = lists_[x.list];
  if (x.prev != kNil)
    nodes_[x.prev].next = x.next;
  else
    L.head = x.next;
  if (x.next != kNil)
    nodes_[x.next].prev = x.prev;
  else
    L.tail = x.prev;
  x.prev = x.next = kNil;
  --L.size;
}

uint32_t ListPolicyBase::FindVictim(int l,
                                    const std::function<bool(const BlockKey&)>& evictable) const {
  for (uint32_t n = lists_[l].tail; n != kNil; n = nodes_[n].prev)
    if (evictable(nodes_[n].key)) return n;
  return kNil;
}

}  // namespace kvtier
