// carve/mr/detail/address_table.hpp — live blocks by address, for pools that look up every free:
// an open-addressing hash table (linear probing, deletion by shifting back, no tombstones), so a
// lookup is one or two cache lines and an insert allocates only when the table doubles. What
// std::unordered_map costs in a node allocation per insert is most of a fast pool's bookkeeping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace carve::detail {

// Values of type V by non-zero address. Not thread-safe.
template <class V>
class AddressTable {
public:
  // The value at `key`, or nullptr.
  V* find(std::uintptr_t key) noexcept {
    if (slots_.empty() || key == 0) {
      return nullptr;
    }
    for (std::size_t i = home(key);; i = (i + 1) & mask()) {
      if (slots_[i].key == key) {
        return &slots_[i].value;
      }
      if (slots_[i].key == 0) {
        return nullptr;
      }
    }
  }
  const V* find(std::uintptr_t key) const noexcept { return const_cast<AddressTable*>(this)->find(key); }

  // Adds `key` (non-zero, not present). Throws std::bad_alloc (nothing changes) when the table
  // must grow and cannot.
  void insert(std::uintptr_t key, V value) {
    make_room();
    place(key, std::move(value));
    ++size_;
  }
  // Room for one more key, so that the next insert cannot throw: a pool calls it before it makes a
  // change that recording the block must not fail after. Throws std::bad_alloc (nothing changes).
  void make_room() {
    if (2 * (size_ + 1) > slots_.size()) {
      grow();
    }
  }

  // Removes `key`; false when it is not present.
  bool erase(std::uintptr_t key) noexcept {
    if (slots_.empty() || key == 0) {
      return false;
    }
    std::size_t i = home(key);
    while (slots_[i].key != key) {
      if (slots_[i].key == 0) {
        return false;
      }
      i = (i + 1) & mask();
    }
    // Shift later entries of the same run back, so that no lookup stops early at the hole.
    for (std::size_t j = (i + 1) & mask(); slots_[j].key != 0; j = (j + 1) & mask()) {
      const std::size_t want = home(slots_[j].key);
      if (((j - want) & mask()) >= ((j - i) & mask())) {
        slots_[i] = std::move(slots_[j]);
        i = j;
      }
    }
    slots_[i].key = 0;
    --size_;
    return true;
  }

  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }

  // Calls `visit(key, value)` for every entry, in no particular order.
  template <class Visit>
  void for_each(Visit&& visit) const {
    for (const Slot& s : slots_) {
      if (s.key != 0) {
        visit(s.key, s.value);
      }
    }
  }

private:
  struct Slot {
    std::uintptr_t key = 0; // 0: empty
    V value{};
  };

  std::size_t mask() const noexcept { return slots_.size() - 1; }
  // Fibonacci hashing of the address without its low bits, which blocks share.
  std::size_t home(std::uintptr_t key) const noexcept {
    return static_cast<std::size_t>(((key >> 4) * 0x9E3779B97F4A7C15ull) >> shift_);
  }

  void place(std::uintptr_t key, V value) noexcept {
    std::size_t i = home(key);
    while (slots_[i].key != 0) {
      i = (i + 1) & mask();
    }
    slots_[i].key = key;
    slots_[i].value = std::move(value);
  }

  void grow() {
    const std::size_t capacity = slots_.empty() ? 64 : 2 * slots_.size();
    std::vector<Slot> old(capacity);
    old.swap(slots_);
    shift_ = 64;
    for (std::size_t c = capacity; c > 1; c >>= 1) {
      --shift_;
    }
    for (Slot& s : old) {
      if (s.key != 0) {
        place(s.key, std::move(s.value));
      }
    }
  }

  std::vector<Slot> slots_;
  std::size_t size_ = 0;
  int shift_ = 64; // 64 - log2(capacity)
};

} // namespace carve::detail
