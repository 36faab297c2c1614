#include "engine/core/page_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <new>

namespace anchorage {
namespace {

constexpr size_t kHugePage = size_t(2) << 20;

size_t PageSize() {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace

PageBuffer::PageBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  const size_t page = PageSize();
  mapped_ = (bytes + page - 1) / page * page;
  const bool huge = mapped_ >= kHugePage;
  // A huge mapping is over-asked by one huge page, then trimmed to a 2 MiB-aligned start.
  const size_t ask = huge ? mapped_ + kHugePage : mapped_;
  void* p = ::mmap(nullptr, ask, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  if (!huge) {
    data_ = p;
    return;
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start) ::munmap(p, aligned - start);
  if (const size_t tail = start + ask - (aligned + mapped_); tail > 0) ::munmap(reinterpret_cast<void*>(aligned + mapped_), tail);
  data_ = reinterpret_cast<void*>(aligned);
  ::madvise(data_, mapped_, MADV_HUGEPAGE);
}

PageBuffer::~PageBuffer() {
  if (data_ != nullptr) ::munmap(data_, mapped_);
}

PageBuffer::PageBuffer(const PageBuffer& other) : PageBuffer(other.size_) {
  if (size_ > 0) std::memcpy(data_, other.data_, size_);
}

PageBuffer& PageBuffer::operator=(const PageBuffer& other) {
  if (this != &other) *this = PageBuffer(other);
  return *this;
}

PageBuffer& PageBuffer::operator=(PageBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(data_, mapped_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
  }
  return *this;
}

}  // namespace anchorage
