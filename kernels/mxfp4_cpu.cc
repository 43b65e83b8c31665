// A few rows times one MXFP4 matrix of a stack, on CPU, read where it is multiplied.
//
// XLA:CPU can only multiply an MXFP4 weight by decoding it to bfloat16 first (four times its
// packed bytes written, then read back by the product): at gpt-oss-20b's shapes that decoding
// and reading was most of a decode step. Here each block of 32 inputs is decoded into vector
// registers (a 16-entry table of e2m1 values, scaled by the block's power of two) and
// multiplied there, so the weight's packed bytes are the only ones read. The values are exactly
// those `swajax.models.quantized` decodes (an e2m1 value times a power of two is exact in
// float32 and in bfloat16; a zero scale gives zeros, a product below float32's normal range is
// flushed as XLA:CPU flushes it); only the order of the sum differs from XLA's product.
//
// Rows in bfloat16 on a CPU with AVX512-BF16 take a shorter path: two blocks' 64 codes become
// bfloat16 bits through two byte tables (one shuffle each for the high and the low bytes), and
// `vdpbf16ps` multiplies them by the rows, whose inputs are put once per call in the order the
// shuffles leave the values in; each block's scale then multiplies its partial sums.
//
// y[m, j] = sum_i x[m, i] * w[i, j] for the live rows m < live (the others are 0), where w is
// matrix `index` of a stack held as the checkpoint publishes it: blocks [..., N, K/32, 16]
// (two codes per byte, the low nibble the even input) and e8m0 scales [..., N, K/32].

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define SWAJAX_AVX512 1
#if defined(__AVX512BF16__)
#define SWAJAX_AVX512_BF16 1
#endif
#endif
#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#define SWAJAX_X86 1
#endif

#if defined(__linux__)
#include <sched.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
constexpr int kRowTile = 4;      // rows sharing one decoded block (2 accumulators each)
constexpr int kRowTileBf16 = 8;  // the same on the bfloat16 path (1 accumulator each)
constexpr int64_t kAhead = 4;    // outputs ahead whose blocks are prefetched
// Outputs computed for every tile of rows before the next ones: their blocks (1.4 KB an output
// at 2880 inputs) are read from memory by the first tile and from the cache by the others.
constexpr int64_t kOutputChunk = 16;

// 2^(s - 127); s = 0 (2^-127, below float32's normal range) gives 0, as XLA:CPU's flushed
// product does. 255 (NaN) is refused when a checkpoint is loaded.
inline float Scale(uint8_t s) {
  uint32_t bits = uint32_t(s) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Outputs [j0, j1) for rows [m0, m0 + rows), rows <= kRowTile; blocks are prefetched for
// outputs up to `end`.
void Tile(const float* x, int64_t k, const uint8_t* blocks, const uint8_t* scales, int64_t groups,
          int64_t n, int64_t j0, int64_t j1, int64_t end, int64_t m0, int rows, float* y) {
#if SWAJAX_AVX512
  const __m512 table = _mm512_loadu_ps(kE2m1);
  const __m128i nibble = _mm_set1_epi8(0x0F);
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* b = blocks + j * groups * 16;
    const uint8_t* s = scales + j * groups;
    __m512 acc[2 * kRowTile];
    for (int r = 0; r < 2 * kRowTile; ++r) acc[r] = _mm512_setzero_ps();
    const char* ahead = reinterpret_cast<const char*>(b + kAhead * groups * 16);
    for (int64_t g = 0; g < groups; ++g) {
      if ((g & 3) == 0 && j + kAhead < end) _mm_prefetch(ahead + g * 16, _MM_HINT_T0);
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + g * 16));
      const __m128i lo = _mm_and_si128(q, nibble);
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), nibble);
      // Inputs 0..15 and 16..31 of the block: low and high nibbles interleaved.
      const __m512i first = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
      const __m512i second = _mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi));
      const __m512 scale = _mm512_set1_ps(Scale(s[g]));
      const __m512 va = _mm512_mul_ps(_mm512_permutexvar_ps(first, table), scale);
      const __m512 vb = _mm512_mul_ps(_mm512_permutexvar_ps(second, table), scale);
      for (int r = 0; r < rows; ++r) {
        const float* xr = x + (m0 + r) * k + g * 32;
        acc[2 * r] = _mm512_fmadd_ps(va, _mm512_loadu_ps(xr), acc[2 * r]);
        acc[2 * r + 1] = _mm512_fmadd_ps(vb, _mm512_loadu_ps(xr + 16), acc[2 * r + 1]);
      }
    }
    for (int r = 0; r < rows; ++r) {
      y[(m0 + r) * n + j] = _mm512_reduce_add_ps(_mm512_add_ps(acc[2 * r], acc[2 * r + 1]));
    }
  }
#else
  // Portable: one block's 32 values decoded into an array, then 32 lanes of partial sums per
  // row (elementwise, so the compiler vectorizes them without reassociating anything).
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* b = blocks + j * groups * 16;
    const uint8_t* s = scales + j * groups;
    float part[kRowTile][32] = {};
    for (int64_t g = 0; g < groups; ++g) {
      const float scale = Scale(s[g]);
      float v[32];
      for (int p = 0; p < 16; ++p) {
        v[2 * p] = kE2m1[b[g * 16 + p] & 0x0F] * scale;
        v[2 * p + 1] = kE2m1[b[g * 16 + p] >> 4] * scale;
      }
      for (int r = 0; r < rows; ++r) {
        const float* xr = x + (m0 + r) * k + g * 32;
        for (int i = 0; i < 32; ++i) part[r][i] += v[i] * xr[i];
      }
    }
    for (int r = 0; r < rows; ++r) {
      float sum = 0.0f;
      for (int i = 0; i < 32; ++i) sum += part[r][i];
      y[(m0 + r) * n + j] = sum;
    }
  }
#endif
}

#if SWAJAX_AVX512_BF16
// The bfloat16 bits of e2m1 code c: its float32 bits' upper half (exact: every e2m1 value is a
// bfloat16), as two byte tables, repeated in each 128-bit lane for `vpshufb`.
struct Bf16Tables {
  __m512i high, low;
  Bf16Tables() {
    alignas(64) uint8_t hi[64], lo[64];
    for (int i = 0; i < 64; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &kE2m1[i % 16], sizeof bits);
      hi[i] = uint8_t(bits >> 24);
      lo[i] = uint8_t(bits >> 16);
    }
    high = _mm512_load_si512(hi);
    low = _mm512_load_si512(lo);
  }
};

// Where the shuffles leave input i of a pair of blocks (64 inputs): the 32-byte load holds the
// two blocks' bytes; its low nibbles (inputs 2p) and high nibbles (2p + 1) make the four
// 128-bit lanes (block 0 low, block 1 low, block 0 high, block 1 high); unpacking the two
// tables' bytes gives value register A (each lane's nibbles 0-7) and B (8-15).
inline int PairSlot(int input) {
  const int block = input / 32, p = (input % 32) / 2, lane = (input % 2) * 2 + block;
  return (p / 8) * 32 + lane * 8 + p % 8;  // A: slots 0-31, B: 32-63
}

// The rows' inputs in that order, per pair of blocks: [rows, pairs, 64] bfloat16 bits.
std::vector<uint16_t> PairOrder(const uint16_t* x, int64_t rows, int64_t k) {
  const int64_t pairs = k / 64;
  std::vector<uint16_t> out(rows * pairs * 64);
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t g = 0; g < pairs; ++g) {
      for (int i = 0; i < 64; ++i) out[(m * pairs + g) * 64 + PairSlot(i)] = x[m * k + g * 64 + i];
    }
  }
  return out;
}

// Outputs [j0, j1) for rows [m0, m0 + rows), rows <= kRowTileBf16: the pairs of blocks through
// `vdpbf16ps`, an odd last block as the float32 path computes it.
void TileBf16(const uint16_t* ordered, const float* x, int64_t k, const uint8_t* blocks,
              const uint8_t* scales, int64_t groups, int64_t n, int64_t j0, int64_t j1,
              int64_t end, int64_t m0, int rows, float* y) {
  static const Bf16Tables tables;
  const int64_t pairs = groups / 2;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* b = blocks + j * groups * 16;
    const uint8_t* s = scales + j * groups;
    const char* ahead = reinterpret_cast<const char*>(b + kAhead * groups * 16);
    __m512 acc[kRowTileBf16];
    for (int r = 0; r < kRowTileBf16; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < pairs; ++g) {
      if ((g & 1) == 0 && j + kAhead < end) _mm_prefetch(ahead + g * 32, _MM_HINT_T0);
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + g * 32));
      const __m256i lo = _mm256_and_si256(q, nibble);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble);
      const __m512i codes = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      const __m512i high = _mm512_shuffle_epi8(tables.high, codes);
      const __m512i low = _mm512_shuffle_epi8(tables.low, codes);
      const __m512bh va = (__m512bh)_mm512_unpacklo_epi8(low, high);
      const __m512bh vb = (__m512bh)_mm512_unpackhi_epi8(low, high);
      // Sums 0-3 and 8-11 are block 0's, 4-7 and 12-15 block 1's.
      const __m512 scale = _mm512_mask_blend_ps(0xF0F0, _mm512_set1_ps(Scale(s[2 * g])),
                                                _mm512_set1_ps(Scale(s[2 * g + 1])));
      for (int r = 0; r < rows; ++r) {
        const uint16_t* xr = ordered + ((m0 + r) * pairs + g) * 64;
        __m512 t = _mm512_dpbf16_ps(_mm512_setzero_ps(), va, (__m512bh)_mm512_loadu_si512(xr));
        t = _mm512_dpbf16_ps(t, vb, (__m512bh)_mm512_loadu_si512(xr + 32));
        acc[r] = _mm512_fmadd_ps(t, scale, acc[r]);
      }
    }
    for (int r = 0; r < rows; ++r) {
      float sum = _mm512_reduce_add_ps(acc[r]);
      if (groups % 2) {  // the last block alone
        const int64_t g = groups - 1;
        const float scale = Scale(s[g]);
        const float* xr = x + (m0 + r) * k + g * 32;
        for (int p = 0; p < 16; ++p) {
          sum += kE2m1[b[g * 16 + p] & 0x0F] * scale * xr[2 * p];
          sum += kE2m1[b[g * 16 + p] >> 4] * scale * xr[2 * p + 1];
        }
      }
      y[(m0 + r) * n + j] = sum;
    }
  }
}
#endif

// The rows as the kernel reads them: float32 always, and for the bfloat16 path their inputs
// in pair order.
struct Rows {
  std::vector<float> widened;  // bfloat16 rows as float32 (empty for float32 rows)
  const float* f32 = nullptr;
  std::vector<uint16_t> ordered;  // empty: the float32 path
};

void Outputs(const Rows& x, int64_t k, const uint8_t* blocks, const uint8_t* scales,
             int64_t groups, int64_t n, int64_t j0, int64_t j1, int64_t live, float* y) {
  for (int64_t c0 = j0; c0 < j1; c0 += kOutputChunk) {
    const int64_t c1 = std::min(j1, c0 + kOutputChunk);
#if SWAJAX_AVX512_BF16
    if (!x.ordered.empty()) {
      for (int64_t m0 = 0; m0 < live; m0 += kRowTileBf16) {
        const int rows = int(std::min<int64_t>(kRowTileBf16, live - m0));
        TileBf16(x.ordered.data(), x.f32, k, blocks, scales, groups, n, c0, c1, j1, m0, rows, y);
      }
      continue;
    }
#endif
    for (int64_t m0 = 0; m0 < live; m0 += kRowTile) {
      const int rows = int(std::min<int64_t>(kRowTile, live - m0));
      Tile(x.f32, k, blocks, scales, groups, n, c0, c1, j1, m0, rows, y);
    }
  }
}

int Cores() {
#if defined(__linux__)
  // The CPUs this process may run on (a container's or `taskset`'s), not the machine's.
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return int(std::max(1u, std::thread::hardware_concurrency()));
}

int Threads(int64_t n) {
  // The outputs split over the cores, each part at least 256 outputs (a thread's start costs
  // tens of microseconds; a part of 256 outputs of a 2880-wide input takes longer than that).
  static const int cores = Cores();
  return int(std::max<int64_t>(1, std::min<int64_t>(cores, n / 256)));
}

ffi::Error Mxfp4Rows(ffi::AnyBuffer x, ffi::Buffer<ffi::U8> blocks,
                     ffi::Buffer<ffi::U8> scales, ffi::Buffer<ffi::S32> index,
                     ffi::Buffer<ffi::S32> live, ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions();
  const auto bd = blocks.dimensions();
  const auto sd = scales.dimensions();
  const size_t lead = bd.size() - 3;
  if (xd.size() != 2 || bd.size() < 3 || bd[bd.size() - 1] != 16 || sd.size() != bd.size() - 1 ||
      index.element_count() != lead) {
    return ffi::Error::InvalidArgument("mxfp4 rows: x [M, K], blocks [..., N, K/32, 16], "
                                       "scales [..., N, K/32] and one index per leading axis");
  }
  const int64_t m = xd[0], k = xd[1], n = bd[lead], groups = bd[lead + 1];
  if (k != groups * 32) {
    return ffi::Error::InvalidArgument("mxfp4 rows: x has " + std::to_string(k) +
                                       " inputs, the weight " + std::to_string(groups * 32));
  }
  // The matrix the index names, clamped into the stack as a dynamic slice would be.
  int64_t at = 0;
  for (size_t a = 0; a < lead; ++a) {
    const int64_t i = std::clamp<int64_t>(index.typed_data()[a], 0, bd[a] - 1);
    at = at * bd[a] + i;
  }
  const uint8_t* b = blocks.typed_data() + at * n * groups * 16;
  const uint8_t* s = scales.typed_data() + at * n * groups;
  const int64_t rows = std::clamp<int64_t>(live.typed_data()[0], 0, m);
  float* out = y->typed_data();
  std::fill(out, out + m * n, 0.0f);
  Rows xs;
  if (x.element_type() == ffi::DataType::BF16) {
    const uint16_t* bits = static_cast<const uint16_t*>(x.untyped_data());
    xs.widened.resize(rows * k);
    for (int64_t i = 0; i < rows * k; ++i) {
      const uint32_t wide = uint32_t(bits[i]) << 16;
      std::memcpy(&xs.widened[i], &wide, sizeof wide);
    }
    xs.f32 = xs.widened.data();
#if SWAJAX_AVX512_BF16
    if (groups >= 2) xs.ordered = PairOrder(bits, rows, k);
#endif
  } else if (x.element_type() == ffi::DataType::F32) {
    xs.f32 = static_cast<const float*>(x.untyped_data());
  } else {
    return ffi::Error::InvalidArgument("mxfp4 rows: x must be float32 or bfloat16");
  }
  const int threads = Threads(n);
  if (threads == 1 || rows == 0) {
    Outputs(xs, k, b, s, groups, n, 0, n, rows, out);
    return ffi::Error::Success();
  }
#if SWAJAX_X86
  const unsigned int csr = _mm_getcsr();  // the caller's flush-to-zero, for every part
#endif
  std::vector<std::thread> pool;
  const int64_t per = (n + threads - 1) / threads;
  int64_t untaken = n;  // outputs from here on are the caller's too (no thread could start)
  for (int t = 1; t < threads; ++t) {
    const int64_t j0 = t * per, j1 = std::min(n, j0 + per);
    try {
      pool.emplace_back([=, &xs] {
#if SWAJAX_X86
        _mm_setcsr(csr);
#endif
        Outputs(xs, k, b, s, groups, n, j0, j1, rows, out);
      });
    } catch (const std::system_error&) {
      untaken = j0;
      break;
    }
  }
  Outputs(xs, k, b, s, groups, n, 0, std::min(n, per), rows, out);
  if (untaken < n) Outputs(xs, k, b, s, groups, n, untaken, n, rows, out);
  for (auto& thread : pool) thread.join();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SwajaxMxfp4Rows, Mxfp4Rows,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
