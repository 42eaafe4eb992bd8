// symheap.cuh — symheap's device-side API for CUDA C++.
//
// Include this header from a kernel compiled with NVRTC or nvcc. It includes no CUDA toolkit
// header (NVRTC alone compiles it: no include path, no cuda_runtime.h) and needs sm_70 or newer
// (release/acquire PTX, __nanosleep); symheap builds it for sm_80 and sm_90.
//
// ---------------------------------------------------------------------------------------------
// Conventions
// ---------------------------------------------------------------------------------------------
// * A symmetric allocation on PE `me` is a pointer `p` plus a peer table `bases` (int64, one entry
//   per PE): bases[me] == p, and bases[r] is the address, in THIS process, of PE r's copy of the
//   same allocation, or 0 when PE r's copy is not load/store-addressable from here.
// * Every pointer argument called "symmetric" (ptr, dst of put, src of get, sig, ...) is an address
//   in the CALLER's copy: anywhere inside the allocation `bases` describes (or, for symheap's own
//   heap, inside any allocation of the heap: the per-peer delta is the same for all of them).
//   `me` (also spelled `from`) is the caller's PE, i.e. the index of the caller's own entry in
//   `bases`; `pe` (also `to`) is the PE whose copy is accessed. Translation is
//       remote = bases[pe] + (ptr - bases[me]).
// * Symmetric memory is global memory; this header addresses it with `.global` PTX.
// * Accessing a PE whose bases[pe] == 0 is an error: translate() returns nullptr for it and every
//   other function then faults with an illegal-address error. Check with is_direct() first when
//   the table may hold zeros (peers on another node, no P2P path).
// * Types: int64_t/uint64_t etc. Under NVRTC this header defines the <stdint.h> names itself
//   (64-bit = long long); define SYMHEAP_HAVE_STDINT before including it if your translation unit
//   already defines them. Under nvcc it includes the C library's <stdint.h>.
//
// Ordering (the PTX memory model, system scope = every GPU and the CPU):
// * load/store/put/get use ordinary (weak) loads and stores. Nothing orders them against later
//   operations of the same thread except fence()/quiet()/a release operation.
// * signal_set/signal_add are RELEASE operations at system scope: every store the calling thread
//   made before (and every store made visible to it, e.g. by the other threads of its block before
//   a __syncthreads(), which put_block/put_warp end with) is visible to any thread that then
//   observes the signal with an ACQUIRE: signal_wait_until / signal_fetch.
//   Pattern: put_block(...); if (threadIdx.x == 0) signal_add(sig, 1, me, pe, bases);
//            ... on the peer: if (signal_wait_until(sig, SYMHEAP_CMP_GE, 1, timeout)) read data.
// * fence(): orders the calling thread's earlier memory operations before its later ones, for
//   every observer in the system (fence.acq_rel.sys).
// * quiet(): fence.sc.sys; after it the calling thread's earlier stores to any PE are performed
//   (visible system wide) before anything it does next.
// * atomics are relaxed atomic read-modify-writes at system scope (atom/red .sys): they are
//   atomic against every GPU and the CPU, and order nothing else; combine them with fence().
// * barrier_block* synchronise a team: on return, every store any member's block made before its
//   call is visible to every thread of every member's calling block.
// * Timeouts are in nanoseconds of %globaltimer. timeout_ns == 0 tests once and never waits;
//   SYMHEAP_WAIT_FOREVER waits without bound (avoid it: a dead peer then hangs the kernel).
//
// Cooperative variants: *_warp must be called by every thread of the warp (of its active part at
// the end of a partial last warp) with the same arguments; *_block by every thread of the block
// with the same arguments. Both end with a warp/block synchronisation, so the data is complete
// for every participating thread (and a signal sent afterwards by one of them covers it).
#pragma once

#if defined(__CUDACC_RTC__)
#ifndef SYMHEAP_HAVE_STDINT
#define SYMHEAP_HAVE_STDINT
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
typedef unsigned long long uintptr_t;
#endif
#else
#include <stddef.h>
#include <stdint.h>
#endif

// Comparison operators of signal_wait_until (the Rust and Python sides use the same numbers).
#define SYMHEAP_CMP_EQ 0
#define SYMHEAP_CMP_NE 1
#define SYMHEAP_CMP_GT 2
#define SYMHEAP_CMP_GE 3
#define SYMHEAP_CMP_LT 4
#define SYMHEAP_CMP_LE 5

// A timeout that never expires.
#define SYMHEAP_WAIT_FOREVER 0xffffffffffffffffull

#define SYMHEAP_DEV __device__ __forceinline__

namespace symheap {

namespace detail {
// Value parameters are not deduced (store(p, 1, ...) with float* p, atomic_add(p, 1, ...) with
// int64_t* p): T comes from the pointer alone.
template <typename T>
struct same {
  typedef T type;
};
}  // namespace detail
#define SYMHEAP_VAL(T) typename detail::same<T>::type

// =============================================================================================
// Translation
// =============================================================================================

// Is PE `pe`'s copy load/store-addressable from here?
SYMHEAP_DEV bool is_direct(int pe, const int64_t* bases) { return bases[pe] != 0; }

// `ptr` (an address in PE `from`'s copy, as this process sees it) translated to PE `to`'s copy:
// bases[to] + (ptr - bases[from]); nullptr when bases[to] == 0.
template <typename T>
SYMHEAP_DEV T* translate(T* ptr, int from, int to, const int64_t* bases) {
  const int64_t base = bases[to];
  if (base == 0) return nullptr;
  const int64_t off = (int64_t)(uintptr_t)ptr - bases[from];
  return (T*)(uintptr_t)(base + off);
}

// translate() plus a promise that the translated pointer is ALIGN-byte aligned.
//
// Why: the compiler proves alignment from where a pointer comes from (a kernel parameter of type
// float4*, an aligned array). A translated pointer is an integer computed from table entries, so
// that knowledge is gone and the compiler must assume only alignof(T): adjacent scalar accesses
// (p[4*i+0..3]) stay four 4-byte stores instead of one 16-byte v4 store. The translated
// pointer IS as aligned as `ptr` whenever the per-peer delta bases[to]-bases[from] is a multiple
// of ALIGN, which holds for symheap's heap (granularity-aligned slots) and for NVSHMEM and torch
// SymmetricMemory buffers; this function re-asserts it with __builtin_assume_aligned on the
// translated pointer. Promising an alignment `ptr` does not have is undefined behaviour.
template <int ALIGN, typename T>
SYMHEAP_DEV T* translate_hint(T* ptr, int from, int to, const int64_t* bases) {
  static_assert(ALIGN > 0 && (ALIGN & (ALIGN - 1)) == 0, "ALIGN must be a power of two");
  return (T*)__builtin_assume_aligned(translate(ptr, from, to, bases), ALIGN);
}

// =============================================================================================
// Element access
// =============================================================================================

// Reads the element at symmetric address `ptr` from PE `pe`'s copy.
template <typename T>
SYMHEAP_DEV T load(const T* ptr, int me, int pe, const int64_t* bases) {
  return *translate(ptr, me, pe, bases);
}

// Writes `v` to the element at symmetric address `ptr` in PE `pe`'s copy.
template <typename T>
SYMHEAP_DEV void store(T* ptr, SYMHEAP_VAL(T) v, int me, int pe, const int64_t* bases) {
  *translate(ptr, me, pe, bases) = v;
}

// =============================================================================================
// Bulk copies (put / get)
// =============================================================================================

namespace detail {

struct alignas(16) vec16 {
  unsigned int x, y, z, w;
};

// Linear thread index in the block and the block's size.
SYMHEAP_DEV unsigned block_rank() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}
SYMHEAP_DEV unsigned block_size() { return blockDim.x * blockDim.y * blockDim.z; }

// Lane of the calling thread in its warp, the warp's thread count (a partial last warp has
// fewer than 32), and the mask of its threads.
SYMHEAP_DEV unsigned warp_rank() { return block_rank() & 31u; }
SYMHEAP_DEV unsigned warp_count() {
  const unsigned first = block_rank() & ~31u;
  const unsigned left = block_size() - first;
  return left < 32u ? left : 32u;
}
SYMHEAP_DEV unsigned warp_mask() {
  const unsigned n = warp_count();
  return n >= 32u ? 0xffffffffu : ((1u << n) - 1u);
}

// Bytes [0, bytes) copied with naturally aligned words of type W (dst and src are congruent
// modulo sizeof(W)): an unaligned head and tail byte by byte, the body as W words with four
// independent loads in flight per thread before the stores. Participant `rank` of `count`.
template <typename W>
SYMHEAP_DEV void copy_words(unsigned char* dst, const unsigned char* src, size_t bytes, size_t rank,
                            size_t count) {
  const size_t mis = (size_t)((uintptr_t)dst & (sizeof(W) - 1));
  size_t head = mis ? sizeof(W) - mis : 0;
  if (head > bytes) head = bytes;
  for (size_t i = rank; i < head; i += count) dst[i] = src[i];
  W* d = (W*)__builtin_assume_aligned(dst + head, sizeof(W));
  const W* s = (const W*)__builtin_assume_aligned(src + head, sizeof(W));
  const size_t n = (bytes - head) / sizeof(W);
  size_t i = rank;
  for (; i + 3 * count < n; i += 4 * count) {
    const W a = s[i];
    const W b = s[i + count];
    const W c = s[i + 2 * count];
    const W e = s[i + 3 * count];
    d[i] = a;
    d[i + count] = b;
    d[i + 2 * count] = c;
    d[i + 3 * count] = e;
  }
  for (; i < n; i += count) d[i] = s[i];
  const size_t done = head + n * sizeof(W);
  for (size_t j = done + rank; j < bytes; j += count) dst[j] = src[j];
}

// Copies `bytes` bytes, shared among `count` participants of which the caller is `rank`. Uses
// 16-byte vector accesses when dst and src are congruent modulo 16 (after a short byte head when
// they are not 16-byte aligned themselves), else the widest word both allow.
SYMHEAP_DEV void copy_bytes_inline(void* dst, const void* src, size_t bytes, size_t rank,
                                   size_t count) {
  unsigned char* d = (unsigned char*)dst;
  const unsigned char* s = (const unsigned char*)src;
  const uintptr_t x = (uintptr_t)d ^ (uintptr_t)s;
  if ((x & 15) == 0) {
    copy_words<vec16>(d, s, bytes, rank, count);
  } else if ((x & 7) == 0) {
    copy_words<unsigned long long>(d, s, bytes, rank, count);
  } else if ((x & 3) == 0) {
    copy_words<unsigned int>(d, s, bytes, rank, count);
  } else if ((x & 1) == 0) {
    copy_words<unsigned short>(d, s, bytes, rank, count);
  } else {
    for (size_t i = rank; i < bytes; i += count) d[i] = s[i];
  }
}

// The same, out of line: put/get of every type and width share one copy of this code instead of
// inlining five unrolled loops at every call site (a call costs nothing next to a transfer).
inline __device__ __noinline__ void copy_bytes(void* dst, const void* src, size_t bytes,
                                               size_t rank, size_t count) {
  copy_bytes_inline(dst, src, bytes, rank, count);
}

}  // namespace detail

// putmem: copies `bytes` bytes from local `src` to symmetric `dst` in PE `pe`'s copy.
// getmem: copies `bytes` bytes from symmetric `src` in PE `pe`'s copy to local `dst`.
// Thread variants: the calling thread alone copies everything.
SYMHEAP_DEV void putmem(void* dst, const void* src, size_t bytes, int me, int pe,
                        const int64_t* bases) {
  detail::copy_bytes(translate(dst, me, pe, bases), src, bytes, 0, 1);
}
SYMHEAP_DEV void getmem(void* dst, const void* src, size_t bytes, int me, int pe,
                        const int64_t* bases) {
  detail::copy_bytes(dst, translate(src, me, pe, bases), bytes, 0, 1);
}
SYMHEAP_DEV void putmem_warp(void* dst, const void* src, size_t bytes, int me, int pe,
                             const int64_t* bases) {
  detail::copy_bytes(translate(dst, me, pe, bases), src, bytes, detail::warp_rank(),
                     detail::warp_count());
  __syncwarp(detail::warp_mask());
}
SYMHEAP_DEV void getmem_warp(void* dst, const void* src, size_t bytes, int me, int pe,
                             const int64_t* bases) {
  detail::copy_bytes(dst, translate(src, me, pe, bases), bytes, detail::warp_rank(),
                     detail::warp_count());
  __syncwarp(detail::warp_mask());
}
SYMHEAP_DEV void putmem_block(void* dst, const void* src, size_t bytes, int me, int pe,
                              const int64_t* bases) {
  detail::copy_bytes(translate(dst, me, pe, bases), src, bytes, detail::block_rank(),
                     detail::block_size());
  __syncthreads();
}
SYMHEAP_DEV void getmem_block(void* dst, const void* src, size_t bytes, int me, int pe,
                              const int64_t* bases) {
  detail::copy_bytes(dst, translate(src, me, pe, bases), bytes, detail::block_rank(),
                     detail::block_size());
  __syncthreads();
}

// put: `nelems` elements from local `src` to symmetric `dst` in PE `pe`'s copy.
// get: `nelems` elements from symmetric `src` in PE `pe`'s copy to local `dst`.
// T must be trivially copyable. 16-byte vector accesses when both pointers are 16-byte aligned.
template <typename T>
SYMHEAP_DEV void put(T* dst, const T* src, size_t nelems, int me, int pe, const int64_t* bases) {
  putmem(dst, src, nelems * sizeof(T), me, pe, bases);
}
template <typename T>
SYMHEAP_DEV void get(T* dst, const T* src, size_t nelems, int me, int pe, const int64_t* bases) {
  getmem(dst, src, nelems * sizeof(T), me, pe, bases);
}
template <typename T>
SYMHEAP_DEV void put_warp(T* dst, const T* src, size_t nelems, int me, int pe,
                          const int64_t* bases) {
  putmem_warp(dst, src, nelems * sizeof(T), me, pe, bases);
}
template <typename T>
SYMHEAP_DEV void get_warp(T* dst, const T* src, size_t nelems, int me, int pe,
                          const int64_t* bases) {
  getmem_warp(dst, src, nelems * sizeof(T), me, pe, bases);
}
template <typename T>
SYMHEAP_DEV void put_block(T* dst, const T* src, size_t nelems, int me, int pe,
                           const int64_t* bases) {
  putmem_block(dst, src, nelems * sizeof(T), me, pe, bases);
}
template <typename T>
SYMHEAP_DEV void get_block(T* dst, const T* src, size_t nelems, int me, int pe,
                           const int64_t* bases) {
  getmem_block(dst, src, nelems * sizeof(T), me, pe, bases);
}

// =============================================================================================
// Ordering
// =============================================================================================

// Orders the calling thread's earlier memory operations before its later ones, system wide.
SYMHEAP_DEV void fence() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

// Completes the calling thread's earlier stores (to any PE) before anything it does next.
SYMHEAP_DEV void quiet() { asm volatile("fence.sc.sys;" ::: "memory"); }

// =============================================================================================
// Atomics on a peer's copy (system scope, relaxed)
// =============================================================================================
//
// Supported T: int32_t, uint32_t, int64_t, uint64_t for every operation; float and double also
// for add, fetch_add, xchg, cas, fetch and set. atomic_X returns nothing (PTX `red`);
// atomic_fetch_X, atomic_xchg and atomic_cas return the value the word held before.

namespace detail {

// The canonical PTX type of T: kind 1 = signed integer, 2 = unsigned integer, 3 = floating point;
// kind 0 = not supported (no specialisation).
template <typename T>
struct atom_type {
  enum { kind = 0 };
};
template <>
struct atom_type<int> {
  typedef int type;
  enum { kind = 1 };
};
template <>
struct atom_type<unsigned int> {
  typedef unsigned int type;
  enum { kind = 2 };
};
template <>
struct atom_type<long long> {
  typedef long long type;
  enum { kind = 1 };
};
template <>
struct atom_type<unsigned long long> {
  typedef unsigned long long type;
  enum { kind = 2 };
};
// `long` is int64_t under nvcc on Linux: map it to the same-sized canonical type.
template <int SIZE>
struct long_canon;
template <>
struct long_canon<4> {
  typedef int s;
  typedef unsigned int u;
};
template <>
struct long_canon<8> {
  typedef long long s;
  typedef unsigned long long u;
};
template <>
struct atom_type<long> {
  typedef long_canon<sizeof(long)>::s type;
  enum { kind = 1 };
};
template <>
struct atom_type<unsigned long> {
  typedef long_canon<sizeof(long)>::u type;
  enum { kind = 2 };
};
template <>
struct atom_type<float> {
  typedef float type;
  enum { kind = 3 };
};
template <>
struct atom_type<double> {
  typedef double type;
  enum { kind = 3 };
};

template <typename T>
SYMHEAP_DEV void check_int() {
  static_assert(atom_type<T>::kind == 1 || atom_type<T>::kind == 2,
                "symheap atomics: this operation supports int32_t, uint32_t, int64_t, uint64_t");
}
template <typename T>
SYMHEAP_DEV void check_any() {
  static_assert(atom_type<T>::kind != 0,
                "symheap atomics: supported types are int32_t, uint32_t, int64_t, uint64_t, "
                "float, double");
}

template <typename D, typename S>
SYMHEAP_DEV D bits(S v) {
  static_assert(sizeof(D) == sizeof(S), "size mismatch");
  // A union: NVRTC knows no __builtin_memcpy, and nvcc and NVRTC both define this punning.
  union {
    S s;
    D d;
  } u;
  u.s = v;
  return u.d;
}

// PTX wrappers on already translated (remote) addresses.
#define SYMHEAP_ATOM_FETCH(NAME, CT, PTX, CONS)          \
  SYMHEAP_DEV CT NAME(CT* p, CT v) {                     \
    CT old;                                              \
    asm volatile("atom.sys.global." PTX " %0, [%1], %2;" \
                 : "=" CONS(old)                         \
                 : "l"(p), CONS(v)                       \
                 : "memory");                            \
    return old;                                          \
  }
#define SYMHEAP_RED(NAME, CT, PTX, CONS)                                           \
  SYMHEAP_DEV void NAME(CT* p, CT v) {                                             \
    asm volatile("red.sys.global." PTX " [%0], %1;" ::"l"(p), CONS(v) : "memory"); \
  }
#define SYMHEAP_ATOM_BOTH(OP, CT, PTX, CONS)    \
  SYMHEAP_ATOM_FETCH(fetch_##OP, CT, PTX, CONS) \
  SYMHEAP_RED(red_##OP, CT, PTX, CONS)

SYMHEAP_ATOM_BOTH(add, int, "add.s32", "r")
SYMHEAP_ATOM_BOTH(add, unsigned int, "add.u32", "r")
SYMHEAP_ATOM_BOTH(add, long long, "add.u64", "l")  // two's complement: u64 add == s64 add
SYMHEAP_ATOM_BOTH(add, unsigned long long, "add.u64", "l")
SYMHEAP_ATOM_BOTH(add, float, "add.f32", "f")
SYMHEAP_ATOM_BOTH(add, double, "add.f64", "d")
SYMHEAP_ATOM_BOTH(and, int, "and.b32", "r")
SYMHEAP_ATOM_BOTH(and, unsigned int, "and.b32", "r")
SYMHEAP_ATOM_BOTH(and, long long, "and.b64", "l")
SYMHEAP_ATOM_BOTH(and, unsigned long long, "and.b64", "l")
SYMHEAP_ATOM_BOTH(or, int, "or.b32", "r")
SYMHEAP_ATOM_BOTH(or, unsigned int, "or.b32", "r")
SYMHEAP_ATOM_BOTH(or, long long, "or.b64", "l")
SYMHEAP_ATOM_BOTH(or, unsigned long long, "or.b64", "l")
SYMHEAP_ATOM_BOTH(xor, int, "xor.b32", "r")
SYMHEAP_ATOM_BOTH(xor, unsigned int, "xor.b32", "r")
SYMHEAP_ATOM_BOTH(xor, long long, "xor.b64", "l")
SYMHEAP_ATOM_BOTH(xor, unsigned long long, "xor.b64", "l")
SYMHEAP_ATOM_BOTH(min, int, "min.s32", "r")
SYMHEAP_ATOM_BOTH(min, unsigned int, "min.u32", "r")
SYMHEAP_ATOM_BOTH(min, long long, "min.s64", "l")
SYMHEAP_ATOM_BOTH(min, unsigned long long, "min.u64", "l")
SYMHEAP_ATOM_BOTH(max, int, "max.s32", "r")
SYMHEAP_ATOM_BOTH(max, unsigned int, "max.u32", "r")
SYMHEAP_ATOM_BOTH(max, long long, "max.s64", "l")
SYMHEAP_ATOM_BOTH(max, unsigned long long, "max.u64", "l")
SYMHEAP_ATOM_FETCH(xchg, unsigned int, "exch.b32", "r")
SYMHEAP_ATOM_FETCH(xchg, unsigned long long, "exch.b64", "l")

#undef SYMHEAP_ATOM_BOTH
#undef SYMHEAP_RED
#undef SYMHEAP_ATOM_FETCH

SYMHEAP_DEV unsigned int cas(unsigned int* p, unsigned int compare, unsigned int v) {
  unsigned int old;
  asm volatile("atom.sys.global.cas.b32 %0, [%1], %2, %3;"
               : "=r"(old)
               : "l"(p), "r"(compare), "r"(v)
               : "memory");
  return old;
}
SYMHEAP_DEV unsigned long long cas(unsigned long long* p, unsigned long long compare,
                                   unsigned long long v) {
  unsigned long long old;
  asm volatile("atom.sys.global.cas.b64 %0, [%1], %2, %3;"
               : "=l"(old)
               : "l"(p), "l"(compare), "l"(v)
               : "memory");
  return old;
}
SYMHEAP_DEV unsigned int ld_relaxed(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.relaxed.sys.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
SYMHEAP_DEV unsigned long long ld_relaxed(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.sys.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
SYMHEAP_DEV void st_relaxed(unsigned int* p, unsigned int v) {
  asm volatile("st.relaxed.sys.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
SYMHEAP_DEV void st_relaxed(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.sys.global.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// The unsigned integer type of T's size (for bitwise-only operations: xchg, cas, load, store).
template <int SIZE>
struct ubits;
template <>
struct ubits<4> {
  typedef unsigned int type;
};
template <>
struct ubits<8> {
  typedef unsigned long long type;
};

}  // namespace detail

#define SYMHEAP_PUBLIC_RMW(OP, CHECK)                                                            \
  template <typename T>                                                                          \
  SYMHEAP_DEV T atomic_fetch_##OP(T* ptr, SYMHEAP_VAL(T) v, int me, int pe,                      \
                                  const int64_t* bases) {                                        \
    detail::CHECK<T>();                                                                          \
    typedef typename detail::atom_type<T>::type C;                                               \
    return (T)detail::fetch_##OP((C*)translate(ptr, me, pe, bases), (C)v);                       \
  }                                                                                              \
  template <typename T>                                                                          \
  SYMHEAP_DEV void atomic_##OP(T* ptr, SYMHEAP_VAL(T) v, int me, int pe, const int64_t* bases) { \
    detail::CHECK<T>();                                                                          \
    typedef typename detail::atom_type<T>::type C;                                               \
    detail::red_##OP((C*)translate(ptr, me, pe, bases), (C)v);                                   \
  }

// atomic_add / atomic_fetch_add: int32, uint32, int64, uint64, float, double (wrapping for ints).
SYMHEAP_PUBLIC_RMW(add, check_any)
// atomic_{and,or,xor,min,max} and their fetch forms: int32, uint32, int64, uint64 (min/max
// compare signed for signed types).
SYMHEAP_PUBLIC_RMW(and, check_int)
SYMHEAP_PUBLIC_RMW(or, check_int)
SYMHEAP_PUBLIC_RMW(xor, check_int)
SYMHEAP_PUBLIC_RMW(min, check_int)
SYMHEAP_PUBLIC_RMW(max, check_int)

#undef SYMHEAP_PUBLIC_RMW

// Writes `v` to PE `pe`'s word and returns the value it held before.
template <typename T>
SYMHEAP_DEV T atomic_xchg(T* ptr, SYMHEAP_VAL(T) v, int me, int pe, const int64_t* bases) {
  detail::check_any<T>();
  typedef typename detail::ubits<sizeof(T)>::type U;
  return detail::bits<T>(detail::xchg((U*)translate(ptr, me, pe, bases), detail::bits<U>(v)));
}
template <typename T>
SYMHEAP_DEV T atomic_fetch_xchg(T* ptr, SYMHEAP_VAL(T) v, int me, int pe, const int64_t* bases) {
  return atomic_xchg(ptr, v, me, pe, bases);
}

// Writes `v` to PE `pe`'s word if it holds `compare` (bitwise); returns the value it held before.
template <typename T>
SYMHEAP_DEV T atomic_cas(T* ptr, SYMHEAP_VAL(T) compare, SYMHEAP_VAL(T) v, int me, int pe,
                         const int64_t* bases) {
  detail::check_any<T>();
  typedef typename detail::ubits<sizeof(T)>::type U;
  return detail::bits<T>(
      detail::cas((U*)translate(ptr, me, pe, bases), detail::bits<U>(compare), detail::bits<U>(v)));
}
template <typename T>
SYMHEAP_DEV T atomic_fetch_cas(T* ptr, SYMHEAP_VAL(T) compare, SYMHEAP_VAL(T) v, int me, int pe,
                               const int64_t* bases) {
  return atomic_cas(ptr, compare, v, me, pe, bases);
}

// Atomic (relaxed, system scope) read of PE `pe`'s word.
template <typename T>
SYMHEAP_DEV T atomic_fetch(const T* ptr, int me, int pe, const int64_t* bases) {
  detail::check_any<T>();
  typedef typename detail::ubits<sizeof(T)>::type U;
  return detail::bits<T>(detail::ld_relaxed((const U*)translate(ptr, me, pe, bases)));
}

// Atomic (relaxed, system scope) write of PE `pe`'s word.
template <typename T>
SYMHEAP_DEV void atomic_set(T* ptr, SYMHEAP_VAL(T) v, int me, int pe, const int64_t* bases) {
  detail::check_any<T>();
  typedef typename detail::ubits<sizeof(T)>::type U;
  detail::st_relaxed((U*)translate(ptr, me, pe, bases), detail::bits<U>(v));
}

// =============================================================================================
// Signals (uint64_t words)
// =============================================================================================

// A launcher's "give up" test for long waits: SYMHEAP_GIVE_UP() is evaluated every 64 polls
// once a wait has polled for a while, and a true result ends the wait as a timeout would.
// symheap's own kernels define it (before including this header) to read the context's abort
// word, so their waits end at once when any PE of the job fails; left undefined, waits end only
// at their timeout.
#ifndef SYMHEAP_GIVE_UP
#define SYMHEAP_GIVE_UP() false
#endif

namespace detail {

SYMHEAP_DEV uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
SYMHEAP_DEV uint64_t ld_acquire(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
SYMHEAP_DEV void st_release(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
SYMHEAP_DEV void red_add_release(uint64_t* p, uint64_t v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
SYMHEAP_DEV uint64_t atom_add_release(uint64_t* p, uint64_t v) {
  uint64_t old;
  asm volatile("atom.release.sys.global.add.u64 %0, [%1], %2;"
               : "=l"(old)
               : "l"(p), "l"(v)
               : "memory");
  return old;
}

SYMHEAP_DEV bool compare(uint64_t x, int cmp, uint64_t v) {
  switch (cmp) {
    case SYMHEAP_CMP_EQ: return x == v;
    case SYMHEAP_CMP_NE: return x != v;
    case SYMHEAP_CMP_GT: return x > v;
    case SYMHEAP_CMP_GE: return x >= v;
    case SYMHEAP_CMP_LT: return x < v;
    case SYMHEAP_CMP_LE: return x <= v;
    default: return false;
  }
}

// Spins until compare(*sig, cmp, v) with an acquire load at system scope; false once timeout_ns
// of %globaltimer have passed since `start` (timeout_ns == 0: test once). Backs off with
// __nanosleep (up to 256 ns) after the first 64 polls so a long wait does not hammer the memory
// system.
SYMHEAP_DEV bool wait_until_since(const uint64_t* sig, int cmp, uint64_t v, uint64_t start,
                                  uint64_t timeout_ns) {
  if (compare(ld_acquire(sig), cmp, v)) return true;
  if (timeout_ns == 0) return false;
  unsigned polls = 0;
  unsigned sleep_ns = 32;
  for (;;) {
    if (compare(ld_acquire(sig), cmp, v)) return true;
    if (timeout_ns != SYMHEAP_WAIT_FOREVER && globaltimer() - start >= timeout_ns) {
      // One last look: the word may have arrived while the timer was read.
      return compare(ld_acquire(sig), cmp, v);
    }
    if (++polls > 64) {
      __nanosleep(sleep_ns);
      if (sleep_ns < 256) sleep_ns *= 2;
      if ((polls & 63) == 0 && SYMHEAP_GIVE_UP()) return compare(ld_acquire(sig), cmp, v);
    }
  }
}

SYMHEAP_DEV bool wait_until(const uint64_t* sig, int cmp, uint64_t v, uint64_t timeout_ns) {
  if (compare(ld_acquire(sig), cmp, v)) return true;
  return timeout_ns != 0 && wait_until_since(sig, cmp, v, globaltimer(), timeout_ns);
}

}  // namespace detail

// Sets PE `pe`'s signal word to `v` (release, system scope).
SYMHEAP_DEV void signal_set(uint64_t* sig, uint64_t v, int me, int pe, const int64_t* bases) {
  detail::st_release(translate(sig, me, pe, bases), v);
}

// Adds `v` to PE `pe`'s signal word (release, system scope).
SYMHEAP_DEV void signal_add(uint64_t* sig, uint64_t v, int me, int pe, const int64_t* bases) {
  detail::red_add_release(translate(sig, me, pe, bases), v);
}

// Adds `v` to PE `pe`'s signal word (release, system scope) and returns the value before.
SYMHEAP_DEV uint64_t signal_fetch_add(uint64_t* sig, uint64_t v, int me, int pe,
                                      const int64_t* bases) {
  return detail::atom_add_release(translate(sig, me, pe, bases), v);
}

// Reads the caller's own signal word (acquire, system scope).
SYMHEAP_DEV uint64_t signal_fetch(const uint64_t* sig) { return detail::ld_acquire(sig); }

// Waits until the caller's own signal word `sig` compares `cmp` (SYMHEAP_CMP_*) to `v`, reading
// it with acquire at system scope. Returns true when the condition holds, false when timeout_ns
// nanoseconds passed first (0: test once; SYMHEAP_WAIT_FOREVER: no bound). An unknown `cmp` never
// holds. After `true`, everything the signalling PE stored before its signal_set/add is visible.
SYMHEAP_DEV bool signal_wait_until(const uint64_t* sig, int cmp, uint64_t v, uint64_t timeout_ns) {
  return detail::wait_until(sig, cmp, v, timeout_ns);
}

// =============================================================================================
// Team barrier (block scoped)
// =============================================================================================
//
// A barrier among the PEs of a team, executed by ONE block on each member (every thread of that
// block calls it with the same arguments). `flags` is a symmetric array of uint64_t, zeroed once
// at allocation, never reset, and used by one barrier stream at a time. `epoch` must increase by
// at least 1 with every barrier on this flags array and be the same on every member (e.g. a
// counter each member increments per call, starting at 1): flags only grow, so a member already
// in the next barrier (epoch + 1) still satisfies this one, and no reset race exists.
// Returns true on every thread when all members arrived; false (on every thread) when a member
// did not arrive within timeout_ns. Threads share the members: thread j handles members j,
// j + blockDim, ... In a kernel captured into a CUDA graph, keep the epoch counter in device
// memory (read it, pass it + 1, store it back from one thread) rather than passing a value the
// graph would freeze; symheap's own symheap_barrier kernel does exactly that.

namespace detail {

// Arrive at every member and wait for every member. remote(j): member j's flag slot for me;
// local(j): my slot in which member j arrives; self: my own team index (skipped).
template <typename Remote, typename Local>
SYMHEAP_DEV bool barrier_core(Remote remote, Local local, int self, int n, uint64_t epoch,
                              uint64_t timeout_ns) {
  // Every thread's earlier stores happen before the arrival stores (release is cumulative).
  __syncthreads();
  const int rank = (int)block_rank();
  const int count = (int)block_size();
  for (int j = rank; j < n; j += count) {
    if (j != self) st_release(remote(j), epoch);
  }
  // One deadline for all the members this thread waits for.
  const uint64_t start = globaltimer();
  bool ok = true;
  for (int j = rank; j < n && ok; j += count) {
    if (j != self) ok = wait_until_since(local(j), SYMHEAP_CMP_GE, epoch, start, timeout_ns);
  }
  // Every thread's later loads follow every acquire (and every thread learns the outcome).
  return __syncthreads_and(ok) != 0;
}

struct world_remote {
  uint64_t* flags;
  const int64_t* bases;
  int me;
  const int* members;
  SYMHEAP_DEV uint64_t* operator()(int j) const {
    return translate(flags + me, me, members[j], bases);
  }
};
struct world_local {
  uint64_t* flags;
  const int* members;
  SYMHEAP_DEV const uint64_t* operator()(int j) const { return flags + members[j]; }
};
struct peer_remote {
  const uint64_t* peer_flags;
  int me;
  SYMHEAP_DEV uint64_t* operator()(int j) const { return (uint64_t*)(uintptr_t)peer_flags[j] + me; }
};
struct team_local {
  const uint64_t* flags;
  SYMHEAP_DEV const uint64_t* operator()(int j) const { return flags + j; }
};

}  // namespace detail

// Team given by world ranks: members[0..n) are the world ranks of the team (me among them);
// `flags` is a symmetric uint64_t array with one word per WORLD rank (flags[r] = where world rank r
// arrives) and `flag_bases` its peer table; `me` is the caller's world rank. Member m's arrival
// stores `epoch` into flags[me] of every other member; then each member waits for flags[m] >=
// epoch for every m.
SYMHEAP_DEV bool barrier_block(uint64_t* flags, const int64_t* flag_bases, int me,
                               const int* members, int n, uint64_t epoch, uint64_t timeout_ns) {
  int self = -1;
  for (int j = 0; j < n; ++j) {
    if (members[j] == me) self = j;
  }
  return detail::barrier_core(detail::world_remote{flags, flag_bases, me, members},
                              detail::world_local{flags, members}, self, n, epoch, timeout_ns);
}

// Same barrier with the team given by flag addresses: `flags` is the caller's array, one word per
// TEAM index; peer_flags[j] is the address (in this process) of member j's array; `me` is the
// caller's team index.
SYMHEAP_DEV bool barrier_block_peers(uint64_t* flags, const uint64_t* peer_flags, int me, int n,
                                     uint64_t epoch, uint64_t timeout_ns) {
  return detail::barrier_core(detail::peer_remote{peer_flags, me}, detail::team_local{flags}, me, n,
                              epoch, timeout_ns);
}

}  // namespace symheap

#undef SYMHEAP_VAL
#undef SYMHEAP_DEV
