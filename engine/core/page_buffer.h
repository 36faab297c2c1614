// Memory straight from the kernel: page-aligned (2 MiB-aligned and backed by huge pages where it is
// that large), zero until written, and never touched before its first use. A copy is a deep copy.
#pragma once

#include <cstddef>
#include <utility>

namespace anchorage {

class PageBuffer {
 public:
  PageBuffer() = default;
  // Maps `bytes` (rounded up to a page) of zeros; throws std::bad_alloc when the kernel refuses.
  explicit PageBuffer(size_t bytes);
  ~PageBuffer();
  PageBuffer(PageBuffer&& other) noexcept { *this = std::move(other); }
  PageBuffer& operator=(PageBuffer&& other) noexcept;
  PageBuffer(const PageBuffer& other);
  PageBuffer& operator=(const PageBuffer& other);

  void* data() const { return data_; }
  size_t size() const { return size_; }  // the bytes asked for

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;
};

// A fixed number of T (trivial types) in a PageBuffer.
template <typename T>
class PageArray {
 public:
  PageArray() = default;
  explicit PageArray(size_t n) : buffer_(n * sizeof(T)), size_(n) {}
  T* data() { return static_cast<T*>(buffer_.data()); }
  const T* data() const { return static_cast<const T*>(buffer_.data()); }
  size_t size() const { return size_; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }

 private:
  PageBuffer buffer_;
  size_t size_ = 0;
};

}  // namespace anchorage
