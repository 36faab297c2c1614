// 8-bit weight matrices with fp32 block scales, and the one type that holds a matrix in any format.
// W[j][i] is code(j, i) x scale(j, i); the FP8 kernels multiply that product rounded once to fp32, the int8
// kernels the codes themselves (matmul.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <variant>

#include "engine/compute/cpu/packed_bf16.h"
#include "engine/core/fp8.h"
#include "engine/core/status.h"

namespace anchorage::cpu {

enum class Q8Code {
  kFp8E4m3,  // OCP e4m3 ("fn": no infinities; 0x7f and 0xff are NaN)
  kInt8,     // two's complement, -127..127
};

// One row of k weights made int8 as PackedQ8::QuantizeInt8 makes them: a block of kInt8Block inputs
// at a time, scale = max |w| / 127 and code = w / scale rounded (0 where the scale is 0). codes [k],
// scales [ceil(k / kInt8Block)].
void QuantizeInt8Row(const float* row, int64_t k, int8_t* codes, float* scales);

// Super-panel p holds columns [32p, 32p + 32) and one row of 32 fp32 scales in column order for each block
// of block_k inputs. FP8 codes: k rows of 32 bytes, columns 0..7, 16..23, 8..15, 24..31 (SlotOf), so 16 bytes
// widen to one AVX-512 vector in the bf16 layout's lane order. int8 codes: a 64-byte row for each pair of
// inputs, column c's two codes at bytes 2c, 2c + 1 (input 2t first), as VPDPWSSD pairs them. Columns past n,
// and the input past an odd k, are zero.
class PackedQ8 {
 public:
  PackedQ8() = default;
  PackedQ8(PackedQ8&&) = default;
  PackedQ8& operator=(PackedQ8&&) = default;
  PackedQ8(const PackedQ8&) = delete;  // the weights' size: never copied by accident
  PackedQ8& operator=(const PackedQ8&) = delete;
  // Hugging Face's block-scaled FP8: codes [n, k] row-major, scales [ceil(n / block_n), ceil(k / block_k)]
  // row-major (weight = code x scale). Refuses NaN codes and scales that are not finite and positive.
  static Result<PackedQ8> FromFp8Blocks(int64_t n, int64_t k, const uint8_t* codes, const float* scales, int64_t block_n,
                                        int64_t block_k, ThreadPool* pool = nullptr);
  // int8 per output row and block of kInt8Block inputs: scale = max |w| / 127, code = w / scale rounded.
  // The kernels multiply the codes by activations made int16 per row and block (QuantizeActivations).
  // row_of(j, out) writes row j of W (k values) to out (from the pool's threads at once, when given one).
  static PackedQ8 QuantizeInt8(int64_t n, int64_t k, const std::function<void(int64_t j, float* out)>& row_of,
                               ThreadPool* pool = nullptr);
  static constexpr int64_t kInt8Block = 32;

  Q8Code code() const { return code_; }
  int64_t rows() const { return n_; }
  int64_t cols() const { return k_; }
  int64_t block_k() const { return block_k_; }
  int64_t panels() const { return (n_ + kPanelColumns - 1) / kPanelColumns; }
  int64_t k_blocks() const { return (k_ + block_k_ - 1) / block_k_; }
  // Code bytes a super-panel takes: int8 rounds k up to whole pairs.
  int64_t panel_bytes() const { return kPanelColumns * (code_ == Q8Code::kInt8 ? (k_ + 1) / 2 * 2 : k_); }
  int64_t bytes() const { return panels() * (panel_bytes() + kPanelColumns * 4 * k_blocks()); }
  const uint8_t* panel(int64_t p) const { return codes_.data() + p * panel_bytes(); }
  const float* panel_scales(int64_t p) const { return scales_.data() + p * kPanelColumns * k_blocks(); }
  static constexpr int64_t SlotOf(int64_t column_in_panel) {
    return (column_in_panel % 16 < 8 ? 0 : 16) + (column_in_panel / 16) * 8 + column_in_panel % 8;
  }
  // The fp32 weight W[j][i] = code x scale, and row j of W (the embedding lookup).
  float At(int64_t j, int64_t i) const;
  uint8_t Code(int64_t j, int64_t i) const { return codes_.data()[CodeIndex(j, i)]; }
  float Scale(int64_t j, int64_t block) const { return scales_.data()[ScaleIndex(j, block)]; }
  void RowToFloat(int64_t j, float* out) const;

 private:
  static PackedQ8 Allocate(Q8Code code, int64_t n, int64_t k, int64_t block_k);
  size_t CodeIndex(int64_t j, int64_t i) const;
  size_t ScaleIndex(int64_t j, int64_t block) const;
  uint8_t& CodeAt(int64_t j, int64_t i);
  float& ScaleAt(int64_t j, int64_t block);
  Q8Code code_ = Q8Code::kInt8;
  int64_t n_ = 0, k_ = 0, block_k_ = 1;
  PageArray<uint8_t> codes_;
  PageArray<float> scales_;
};

// Activations for int8 weights: each row's block of PackedQ8::kInt8Block inputs as int16 codes with one fp32
// scale, scale = max |x| / 32767 and code = x times fp32(1 / scale) rounded (within half a step and 2^-8 of
// one of x / scale); a block holding NaN or an infinity gets scale NaN
// (its outputs are NaN). Row r's codes at codes + r * ActivationCodesStride(k) (past k zero), its scales at
// scales + r * ActivationScalesStride(k).
int64_t ActivationCodesStride(int64_t k);
int64_t ActivationScalesStride(int64_t k);
void QuantizeActivations(const float* x, int64_t ldx, int64_t rows, int64_t k, int16_t* codes, float* scales);

// How a model's matrices are held: as the checkpoint stores them, or made 8-bit at load.
enum class WeightFormat { kBf16, kFp8E4m3, kInt8 };
const char* WeightFormatName(WeightFormat format);  // "bf16", "fp8-e4m3", "int8"
Result<WeightFormat> WeightFormatFromName(const std::string& name);

// One weight matrix in whichever format it is held.
class PackedMatrix {
 public:
  explicit PackedMatrix(PackedBf16 m) : m_(std::move(m)) {}
  explicit PackedMatrix(PackedQ8 m) : m_(std::move(m)) {}
  WeightFormat format() const;
  const PackedBf16* bf16() const { return std::get_if<PackedBf16>(&m_); }
  const PackedQ8* q8() const { return std::get_if<PackedQ8>(&m_); }
  int64_t rows() const;
  int64_t cols() const;
  int64_t bytes() const;
  void RowToFloat(int64_t j, float* out) const;

 private:
  std::variant<PackedBf16, PackedQ8> m_;
};

}  // namespace anchorage::cpu
