// Instantiates every template of symheap.cuh for every type it supports, so a template that does
// not compile for some type fails CI (tests/nvrtc_compile.rs compiles this for sm_80 and sm_90).
#include "symheap.cuh"

struct alignas(2) bf16_bits {
  unsigned short x;
};
struct alignas(16) f32x4 {
  float a, b, c, d;
};

// Everything generic over T (element access, copies, translation).
#define SYMHEAP_TEST_COPY(NAME, T)                                                   \
  extern "C" __global__ void copy_##NAME(T* sym, T* local, size_t n, int me, int pe, \
                                         const int64_t* bases, T* out) {             \
    T* r = symheap::translate(sym, me, pe, bases);                                   \
    const T* cr = symheap::translate((const T*)sym, me, pe, bases);                  \
    T* h1 = symheap::translate_hint<alignof(T)>(sym, me, pe, bases);                 \
    T* h16 = symheap::translate_hint<16>(sym, me, pe, bases);                        \
    out[0] = *r;                                                                     \
    out[1] = *cr;                                                                    \
    out[2] = *h1;                                                                    \
    out[3] = *h16;                                                                   \
    out[4] = symheap::load(sym, me, pe, bases);                                      \
    out[5] = symheap::load((const T*)sym, me, pe, bases);                            \
    symheap::store(sym, out[6], me, pe, bases);                                      \
    symheap::put(sym, local, n, me, pe, bases);                                      \
    symheap::get(local, sym, n, me, pe, bases);                                      \
    symheap::put(sym, (const T*)local, n, me, pe, bases);                            \
    symheap::get(local, (const T*)sym, n, me, pe, bases);                            \
    symheap::put_warp(sym, local, n, me, pe, bases);                                 \
    symheap::get_warp(local, sym, n, me, pe, bases);                                 \
    symheap::put_block(sym, local, n, me, pe, bases);                                \
    symheap::get_block(local, sym, n, me, pe, bases);                                \
  }

// Operations every atomic type has.
#define SYMHEAP_TEST_ATOMIC_ANY(NAME, T)                                                          \
  extern "C" __global__ void atomic_any_##NAME(T* sym, T v, int me, int pe, const int64_t* bases, \
                                               T* out) {                                          \
    symheap::atomic_add(sym, v, me, pe, bases);                                                   \
    out[0] = symheap::atomic_fetch_add(sym, v, me, pe, bases);                                    \
    out[1] = symheap::atomic_xchg(sym, v, me, pe, bases);                                         \
    out[2] = symheap::atomic_fetch_xchg(sym, v, me, pe, bases);                                   \
    out[3] = symheap::atomic_cas(sym, out[0], v, me, pe, bases);                                  \
    out[4] = symheap::atomic_fetch_cas(sym, out[1], v, me, pe, bases);                            \
    out[5] = symheap::atomic_fetch((const T*)sym, me, pe, bases);                                 \
    symheap::atomic_set(sym, v, me, pe, bases);                                                   \
  }

// Integer-only operations.
#define SYMHEAP_TEST_ATOMIC_INT(NAME, T)                                                          \
  extern "C" __global__ void atomic_int_##NAME(T* sym, T v, int me, int pe, const int64_t* bases, \
                                               T* out) {                                          \
    symheap::atomic_and(sym, v, me, pe, bases);                                                   \
    symheap::atomic_or(sym, v, me, pe, bases);                                                    \
    symheap::atomic_xor(sym, v, me, pe, bases);                                                   \
    symheap::atomic_min(sym, v, me, pe, bases);                                                   \
    symheap::atomic_max(sym, v, me, pe, bases);                                                   \
    out[0] = symheap::atomic_fetch_and(sym, v, me, pe, bases);                                    \
    out[1] = symheap::atomic_fetch_or(sym, v, me, pe, bases);                                     \
    out[2] = symheap::atomic_fetch_xor(sym, v, me, pe, bases);                                    \
    out[3] = symheap::atomic_fetch_min(sym, v, me, pe, bases);                                    \
    out[4] = symheap::atomic_fetch_max(sym, v, me, pe, bases);                                    \
  }

SYMHEAP_TEST_COPY(i8, int8_t)
SYMHEAP_TEST_COPY(u8, uint8_t)
SYMHEAP_TEST_COPY(i16, int16_t)
SYMHEAP_TEST_COPY(u16, uint16_t)
SYMHEAP_TEST_COPY(i32, int32_t)
SYMHEAP_TEST_COPY(u32, uint32_t)
SYMHEAP_TEST_COPY(i64, int64_t)
SYMHEAP_TEST_COPY(u64, uint64_t)
SYMHEAP_TEST_COPY(f32, float)
SYMHEAP_TEST_COPY(f64, double)
SYMHEAP_TEST_COPY(bf16, bf16_bits)
SYMHEAP_TEST_COPY(f32x4, f32x4)

SYMHEAP_TEST_ATOMIC_ANY(i32, int32_t)
SYMHEAP_TEST_ATOMIC_ANY(u32, uint32_t)
SYMHEAP_TEST_ATOMIC_ANY(i64, int64_t)
SYMHEAP_TEST_ATOMIC_ANY(u64, uint64_t)
SYMHEAP_TEST_ATOMIC_ANY(f32, float)
SYMHEAP_TEST_ATOMIC_ANY(f64, double)
// `long` / `unsigned long` are int64_t / uint64_t under nvcc on Linux.
SYMHEAP_TEST_ATOMIC_ANY(l, long)
SYMHEAP_TEST_ATOMIC_ANY(ul, unsigned long)

SYMHEAP_TEST_ATOMIC_INT(i32, int32_t)
SYMHEAP_TEST_ATOMIC_INT(u32, uint32_t)
SYMHEAP_TEST_ATOMIC_INT(i64, int64_t)
SYMHEAP_TEST_ATOMIC_INT(u64, uint64_t)
SYMHEAP_TEST_ATOMIC_INT(l, long)
SYMHEAP_TEST_ATOMIC_INT(ul, unsigned long)

// Byte copies, ordering, signals, barriers.
extern "C" __global__ void untyped(void* sym, void* local, size_t bytes, uint64_t* sig,
                                   uint64_t* flags, const int64_t* bases,
                                   const uint64_t* peer_flags, const int* members, int me, int pe,
                                   int n, uint64_t epoch, uint64_t timeout_ns, uint64_t* out) {
  symheap::putmem(sym, local, bytes, me, pe, bases);
  symheap::getmem(local, sym, bytes, me, pe, bases);
  symheap::putmem_warp(sym, local, bytes, me, pe, bases);
  symheap::getmem_warp(local, sym, bytes, me, pe, bases);
  symheap::putmem_block(sym, local, bytes, me, pe, bases);
  symheap::getmem_block(local, sym, bytes, me, pe, bases);
  symheap::fence();
  symheap::quiet();
  symheap::signal_set(sig, 1, me, pe, bases);
  symheap::signal_add(sig, 1, me, pe, bases);
  out[0] = symheap::signal_fetch_add(sig, 1, me, pe, bases);
  out[1] = symheap::signal_fetch(sig);
  out[2] = symheap::is_direct(pe, bases);
  for (int cmp = SYMHEAP_CMP_EQ; cmp <= SYMHEAP_CMP_LE; ++cmp) {
    out[3 + cmp] = symheap::signal_wait_until(sig, cmp, epoch, timeout_ns);
  }
  out[9] = symheap::signal_wait_until(sig, SYMHEAP_CMP_GE, epoch, SYMHEAP_WAIT_FOREVER);
  out[10] = symheap::barrier_block(flags, bases, me, members, n, epoch, timeout_ns);
  out[11] = symheap::barrier_block_peers(flags, peer_flags, me, n, epoch, timeout_ns);
}

// The alignment hint: with it, four adjacent float stores through a translated pointer become one
// 16-byte st.global.v4.f32 (the test checks the PTX).
extern "C" __global__ void hint_vector_store(float* sym, int me, int pe, const int64_t* bases) {
  float* r = symheap::translate_hint<16>(sym, me, pe, bases);
  const int i = threadIdx.x;
  const float x = (float)i;
  r[4 * i + 0] = x;
  r[4 * i + 1] = x + 1.0f;
  r[4 * i + 2] = x + 2.0f;
  r[4 * i + 3] = x + 3.0f;
}
