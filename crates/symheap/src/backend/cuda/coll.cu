// symheap's collective kernels for the CUDA backend (all_reduce one-shot / two-shot, all_gather,
// reduce_scatter, broadcast, alltoall). Compiled at run time by NVRTC as its own program (see
// nvrtc.rs, `COLL`) with symheap.cuh passed as an in-memory header; no CUDA toolkit header.
//
// =============================================================================================
// Launch contract (the Rust launcher relies on it exactly)
// =============================================================================================
// * 1-D grid, 1 <= gridDim.x <= 1024; 1-D block, blockDim.x a multiple of 32 with
//   n <= blockDim.x <= 1024 (512 recommended). No dynamic shared memory (static: 536 bytes).
// * Every member launches the same kernel with the same grid, block and arguments, in the same
//   order on its stream; pointer arguments are symmetric (same offsets on every member), so every
//   member takes the same internal path. Block b of one member synchronises only with block b of
//   the others (per-block barriers): no block waits for another block of its own grid. A grid
//   larger than what is resident at once relies on blocks being dispatched in index order (they
//   are in practice); prefer resident grids: every kernel uses <= 64 registers per thread
//   (__launch_bounds__(1024)), i.e. 2 blocks of 512 threads per SM.
// * Launchers may change the tuning constants below (#ifndef SYMHEAP_COLL_*) by defining them
//   ahead of this source (SYMHEAP_COLL_DEFINES); every member must use the same values.
// * Grids measured best on 2 x H200 (132 SMs, 512 threads, bf16):
//     ar_oneshot  (LL, <= 32 KiB): ceil(bytes / 2 KiB) blocks, at most 2 x SMs;
//     ar_ll128    (LL128, <= 4 MiB): ceil(bytes / 4 KiB), at most 2 x SMs (4 x SMs, two waves,
//                 from 3 MiB);
//     ar_flag     ceil(bytes / 8 KiB), at most SMs;
//     ar_twoshot  clamp(ceil(bytes / 64 KiB), 16, 2 x SMs) (the push path needs <= 512);
//     exchange_ll / exchange_ll128 as ar_oneshot / ar_ll128, over the bytes per member (a
//                 broadcast never in two waves);
//     allgather / reduce_scatter / broadcast / alltoall: clamp(ceil(bytes / 16 KiB), 1, 2 x SMs).
// * Trailing team arguments, in this order (COLL_TEAM_PARAMS):
//     const int64_t* bases       device array [n]: heap base of each member in this process's
//                                address space; member j's copy of my symmetric p is
//                                bases[j] + (p - bases[me]). Deltas must be multiples of 16 for
//                                the vector paths (they are for symheap's heap); otherwise the
//                                kernels fall back to element / byte loops.
//     uint64_t* flags            my flag area: uint64 [2 rounds][1024 blocks][n], zeroed once.
//     const uint64_t* peer_flags device array [n]: address of member j's flag area.
//     uint64_t* ctl              ctl[0] = epoch (completed launches on this team), ctl[1] =
//                                blocks-done counter (0 between launches); zeroed once.
//     int me, int n              my team index, team size (1 <= n <= 64).
//     uint64_t timeout_ns        bound on every wait (%globaltimer ns).
//     uint32_t* error            host-mapped word: 3 on a timeout, 4 on a launch outside the
//                                kernel's preconditions (st.relaxed.sys).
// * Epochs: every block reads e = ctl[0] + 1 at entry; the last block to finish stores ctl[0] = e
//   and resets ctl[1] (kernel completion publishes both to the next launch on the stream). Flags
//   hold epochs, which only grow, so they are never reset and a CUDA graph replays correctly.
// * A block whose wait times out reports error 3, touches no data any more, and still counts
//   itself done (the epoch advances on every member, keeping members aligned).
// * The one-shot scratch [2 parities][n slots][slot_bytes] must be ZEROED ONCE when the team is
//   created (the small-message LL path below checks flags stored inside the data), slot_bytes a
//   multiple of 16 and count * sizeof(T) <= slot_bytes. Its LL kernel (ar_oneshot) needs
//   32 * ceil(bytes / 16) <= slot_bytes / n (rounded down to 16), i.e. slot_bytes >= 2 n x
//   bytes; the flag kernel (ar_flag) any size up to slot_bytes. The LL128 kernels use their own
//   region (see ar_ll128), also zeroed once.
//
// Reductions: op 0 sum, 1 min, 2 max, 3 prod (another op: the rounds run, no data is written).
// Members are combined in team order 0..n-1 whoever computes, so every member's result is
// bit-identical. f16/bf16 are accumulated in f32 and rounded once (round to nearest even) when
// stored; i32 sum and prod wrap. Conversions use PTX cvt (cvt.f32.f16, cvt.rn.f16x2.f32,
// cvt.rn.bf16x2.f32: IEEE round-to-nearest-even, subnormals kept, NaN stays NaN) instead of
// cuda_fp16.h; bf16 -> f32 is a 16-bit shift.
//
// Data path: 16-byte vectors (ld.global.cg.v4.u32 / st.global.v4.u32) whenever every pointer
// involved is 16-byte aligned, SYMHEAP_COLL_UNROLL independent vector loads per thread and source
// in flight, grid-stride loops; element / byte loops handle tails and unaligned views. Loads use
// .cg (L2, not the SM's non-coherent L1), so data a peer stored is never read from a stale L1
// line. No atomics on the data path.
//
// Ordering argument used by every barrier (coll::sync_at): all threads of the block
// __syncthreads(), then thread j (one per peer) stores the epoch with st.release.sys into peer
// j's flag and waits with ld.acquire.sys on its own flag for peer j; a final __syncthreads()
// spreads the outcome. We rely on the PTX memory model: bar.sync is a morally strong CTA-scope
// synchronisation, so every data store of every thread of the block precedes the signalling
// thread's release in causality order; a release at system scope is cumulative, so a peer thread
// that acquires the flag (and then, through its own bar.sync, every thread of its block) observes
// all those stores. st.release.sys is fence.acq_rel.sys + a strong store: no further fence.
// (Checked on 2 x H200: 300-launch stress runs of one-shot / two-shot with verification after
// every launch pass without per-thread fences; SYMHEAP_COLL_WARP_FENCE=1 adds them, ~3 us.)
// Entry rounds (no data stored by this kernel yet) also use release by default;
// SYMHEAP_COLL_RELAXED_ENTRY=1 makes them relaxed like torch SymmetricMemory (~0.5 us faster
// two-shot, but it relies on kernel boundaries publishing earlier stores system wide).

// The context's abort word (host-mapped, 0 while the job is healthy), set by the host when it
// loads this module. Long waits poll it (SYMHEAP_GIVE_UP), so when any PE fails (exits, aborts,
// diverges) every wait ends within microseconds instead of at its timeout, and the host reports
// the failure.
__device__ const volatile unsigned int* symheap_abort_word;
#define SYMHEAP_GIVE_UP() (symheap_abort_word != nullptr && *symheap_abort_word != 0u)
#include "symheap.cuh"

// Error code written to `error` when a collective's barrier times out.
#define SYMHEAP_ERR_COLL_TIMEOUT 3u

// Independent 16-byte loads per thread (and per source) in flight in the vector loops.
#ifndef SYMHEAP_COLL_UNROLL
#define SYMHEAP_COLL_UNROLL 4
#endif
// The same for the one-shot all_reduce's reduction (its grid is sized so that a thread has few
// vectors).
#ifndef SYMHEAP_COLL_UNROLL_ONESHOT
#define SYMHEAP_COLL_UNROLL_ONESHOT 2
#endif
// Vectors per thread and source in the reductions over n != 2 members, which keep f32 / i32
// accumulators live across the members (16-bit types: twice the registers of 32-bit ones).
#ifndef SYMHEAP_COLL_UNROLL_N32
#define SYMHEAP_COLL_UNROLL_N32 2
#endif
#ifndef SYMHEAP_COLL_UNROLL_N16
#define SYMHEAP_COLL_UNROLL_N16 1
#endif

#define COLL_DEV __device__ __forceinline__
#define COLL_MAX_TEAM 64
#define COLL_MAX_BLOCKS 1024

namespace coll {

typedef symheap::detail::vec16 v16;

// ---------------------------------------------------------------------------------------------
// Memory access. Every data access goes through these asm volatile statements, so the compiler
// keeps them in program order with each other and with the barriers (which clobber memory).
// Addresses are generic pointers to global memory (identical to global addresses in CUDA).
// ---------------------------------------------------------------------------------------------

#ifndef SYMHEAP_COLL_LD16
#define SYMHEAP_COLL_LD16 "ld.global.cg.v4.u32"
#endif
#ifndef SYMHEAP_COLL_WARP_FENCE
#define SYMHEAP_COLL_WARP_FENCE 0
#endif
COLL_DEV v16 ld16(const void* p) {
  v16 v;
  asm volatile(SYMHEAP_COLL_LD16 " {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
COLL_DEV void st16(void* p, const v16& v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}
COLL_DEV uint32_t ld_u32(const void* p) {
  uint32_t v;
  asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
COLL_DEV void st_u32(void* p, uint32_t v) {
  asm volatile("st.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
COLL_DEV uint16_t ld_u16(const void* p) {
  uint16_t v;
  asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}
COLL_DEV void st_u16(void* p, uint16_t v) {
  asm volatile("st.global.u16 [%0], %1;" ::"l"(p), "h"(v) : "memory");
}
COLL_DEV uint8_t ld_u8(const void* p) {
  uint16_t v;
  asm volatile("ld.global.cg.u8 %0, [%1];" : "=h"(v) : "l"(p));
  return (uint8_t)v;
}
COLL_DEV void st_u8(void* p, uint8_t v) {
  asm volatile("st.global.u8 [%0], %1;" ::"l"(p), "h"((uint16_t)v) : "memory");
}

COLL_DEV bool aligned16(const void* p) { return ((uintptr_t)p & 15) == 0; }

template <typename T>
COLL_DEV T* offset_bytes(T* p, int64_t delta) {
  return (T*)((uintptr_t)p + (uintptr_t)delta);
}

// ---------------------------------------------------------------------------------------------
// Element types: A is the accumulator type, E the elements per 16-byte vector.
// ---------------------------------------------------------------------------------------------

COLL_DEV float f16_to_f32(uint16_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
COLL_DEV uint16_t f32_to_f16(float f) {
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
COLL_DEV float bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
COLL_DEV uint16_t f32_to_bf16(float f) {
  // Round to nearest even (NaN stays a quiet NaN): the same as cvt.rn.bf16.f32 on sm_80+.
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
// Two floats into one word of two 16-bit values: `lo` in bits 0..15, `hi` in bits 16..31.
COLL_DEV uint32_t pack_f16x2(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
COLL_DEV uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

// Tag types for the 16-bit formats (storage uint16_t).
struct f16 {};
struct bf16 {};

template <typename D>
struct dtype;

template <>
struct dtype<float> {
  typedef float S;  // storage
  typedef float A;  // accumulator
  enum { E = 4 };
  static COLL_DEV void unpack(const v16& v, A (&a)[E]) {
    a[0] = __uint_as_float(v.x);
    a[1] = __uint_as_float(v.y);
    a[2] = __uint_as_float(v.z);
    a[3] = __uint_as_float(v.w);
  }
  static COLL_DEV v16 pack(const A (&a)[E]) {
    v16 v;
    v.x = __float_as_uint(a[0]);
    v.y = __float_as_uint(a[1]);
    v.z = __float_as_uint(a[2]);
    v.w = __float_as_uint(a[3]);
    return v;
  }
  static COLL_DEV A load(const S* p) { return __uint_as_float(ld_u32(p)); }
  static COLL_DEV void store(S* p, A a) { st_u32(p, __float_as_uint(a)); }
};

template <>
struct dtype<int32_t> {
  typedef int32_t S;
  typedef int32_t A;
  enum { E = 4 };
  static COLL_DEV void unpack(const v16& v, A (&a)[E]) {
    a[0] = (int32_t)v.x;
    a[1] = (int32_t)v.y;
    a[2] = (int32_t)v.z;
    a[3] = (int32_t)v.w;
  }
  static COLL_DEV v16 pack(const A (&a)[E]) {
    v16 v;
    v.x = (uint32_t)a[0];
    v.y = (uint32_t)a[1];
    v.z = (uint32_t)a[2];
    v.w = (uint32_t)a[3];
    return v;
  }
  static COLL_DEV A load(const S* p) { return (int32_t)ld_u32(p); }
  static COLL_DEV void store(S* p, A a) { st_u32(p, (uint32_t)a); }
};

template <>
struct dtype<f16> {
  typedef uint16_t S;
  typedef float A;
  enum { E = 8 };
  static COLL_DEV void half2(uint32_t w, A& lo, A& hi) {
    lo = f16_to_f32((uint16_t)(w & 0xffffu));
    hi = f16_to_f32((uint16_t)(w >> 16));
  }
  static COLL_DEV void unpack(const v16& v, A (&a)[E]) {
    half2(v.x, a[0], a[1]);
    half2(v.y, a[2], a[3]);
    half2(v.z, a[4], a[5]);
    half2(v.w, a[6], a[7]);
  }
  static COLL_DEV v16 pack(const A (&a)[E]) {
    v16 v;
    v.x = pack_f16x2(a[0], a[1]);
    v.y = pack_f16x2(a[2], a[3]);
    v.z = pack_f16x2(a[4], a[5]);
    v.w = pack_f16x2(a[6], a[7]);
    return v;
  }
  static COLL_DEV A load(const S* p) { return f16_to_f32(ld_u16(p)); }
  static COLL_DEV void store(S* p, A a) { st_u16(p, f32_to_f16(a)); }
};

template <>
struct dtype<bf16> {
  typedef uint16_t S;
  typedef float A;
  enum { E = 8 };
  static COLL_DEV void half2(uint32_t w, A& lo, A& hi) {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
  }
  static COLL_DEV void unpack(const v16& v, A (&a)[E]) {
    half2(v.x, a[0], a[1]);
    half2(v.y, a[2], a[3]);
    half2(v.z, a[4], a[5]);
    half2(v.w, a[6], a[7]);
  }
  static COLL_DEV v16 pack(const A (&a)[E]) {
    v16 v;
    v.x = pack_bf16x2(a[0], a[1]);
    v.y = pack_bf16x2(a[2], a[3]);
    v.z = pack_bf16x2(a[4], a[5]);
    v.w = pack_bf16x2(a[6], a[7]);
    return v;
  }
  static COLL_DEV A load(const S* p) { return bf16_to_f32(ld_u16(p)); }
  static COLL_DEV void store(S* p, A a) { st_u16(p, f32_to_bf16(a)); }
};

// Vector loads in flight per thread and source for element type D.
template <typename D>
struct unroll {
  enum {
    U = sizeof(typename dtype<D>::S) == 2 ? SYMHEAP_COLL_UNROLL_N16 : SYMHEAP_COLL_UNROLL_N32
  };
};

// ---------------------------------------------------------------------------------------------
// Reduction operators (OP: 0 sum, 1 min, 2 max, 3 prod).
// ---------------------------------------------------------------------------------------------

template <int OP>
COLL_DEV float combine(float a, float b) {
  if (OP == 0) return a + b;
  if (OP == 1) return fminf(a, b);
  if (OP == 2) return fmaxf(a, b);
  return a * b;
}
template <int OP>
COLL_DEV int32_t combine(int32_t a, int32_t b) {
  if (OP == 0) return (int32_t)((uint32_t)a + (uint32_t)b);  // wrapping
  if (OP == 1) return a < b ? a : b;
  if (OP == 2) return a > b ? a : b;
  return (int32_t)((uint32_t)a * (uint32_t)b);  // wrapping
}

template <int OP, typename A, int E>
COLL_DEV void combine_all(A (&acc)[E], const A (&x)[E]) {
#pragma unroll
  for (int k = 0; k < E; ++k) acc[k] = combine<OP>(acc[k], x[k]);
}

// acc = acc (op) v, element-wise; one uniform branch per vector (op is the same for the grid).
template <typename D>
COLL_DEV void combine_vec(typename dtype<D>::A (&acc)[dtype<D>::E], const v16& v, int op) {
  typename dtype<D>::A x[dtype<D>::E];
  dtype<D>::unpack(v, x);
  switch (op) {
    case 0: combine_all<0>(acc, x); break;
    case 1: combine_all<1>(acc, x); break;
    case 2: combine_all<2>(acc, x); break;
    default: combine_all<3>(acc, x); break;
  }
}

template <typename A>
COLL_DEV A combine_rt(A a, A b, int op) {
  switch (op) {
    case 0: return combine<0>(a, b);
    case 1: return combine<1>(a, b);
    case 2: return combine<2>(a, b);
    default: return combine<3>(a, b);
  }
}

COLL_DEV bool valid_op(int op) { return op >= 0 && op <= 3; }

// ---------------------------------------------------------------------------------------------
// Team state, entry and exit, and the per-block cross-PE barrier.
// ---------------------------------------------------------------------------------------------

struct Team {
  const int64_t* bases;
  uint64_t* flags;
  const uint64_t* peer_flags;
  uint64_t* ctl;
  int me;
  int n;
  uint64_t timeout_ns;
  uint32_t* error;
};

#define COLL_TEAM_PARAMS                                                                           \
  const int64_t *bases, uint64_t *flags, const uint64_t *peer_flags, uint64_t *ctl, int me, int n, \
      uint64_t timeout_ns, uint32_t *error
#define COLL_TEAM \
  Team { bases, flags, peer_flags, ctl, me, n, timeout_ns, error }

// Per-block state every kernel sets up at entry (static shared memory).
struct Block {
  uint64_t epoch;                // e = ctl[0] + 1 of this launch
  int64_t delta[COLL_MAX_TEAM];  // bases[j] - bases[me]: member j's copy = my pointer + delta[j]
  int deltas_aligned;            // every delta is a multiple of 16
};

// Translation with the cached deltas: member j's copy of my symmetric pointer p.
template <typename T>
COLL_DEV T* at(const Block& blk, T* p, int j) {
  return offset_bytes(p, blk.delta[j]);
}

// Reports `code` and raises the abort word: after a timeout or a broken launch the members are
// out of step, so every later wait of this PE gives up at once instead of timing out in turn
// (a grid larger than what is resident would otherwise wait a timeout per wave of blocks).
COLL_DEV void report(uint32_t* error, uint32_t code) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(error), "r"(code) : "memory");
  if (symheap_abort_word != nullptr) {
    asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(symheap_abort_word), "r"(1u)
                 : "memory");
  }
}

// Entry: reads the epoch (ctl[0] only changes at the very end of the previous launch, so every
// block of this launch reads the same value) and caches the translation deltas.
COLL_DEV void begin(const Team& t, Block& blk) {
  if (threadIdx.x == 0) {
    blk.epoch = *(volatile const uint64_t*)&t.ctl[0] + 1;
    int64_t mis = 0;
    const int64_t mine = t.bases[t.me];
    for (int j = 0; j < t.n; ++j) mis |= t.bases[j] - mine;
    blk.deltas_aligned = (mis & 15) == 0;
  }
  const int64_t mine = t.bases[t.me];
  for (int j = threadIdx.x; j < t.n; j += blockDim.x) blk.delta[j] = t.bases[j] - mine;
  __syncthreads();
}

// Entry of the one-shot all_reduce, which needs no deltas: `ctl0` is ctl[0] as the calling
// thread read it (every thread reads it, together with its first loads, to save a round trip).
COLL_DEV void begin_epoch(Block& blk, uint64_t ctl0) {
  if (threadIdx.x == 0) blk.epoch = ctl0 + 1;
  __syncthreads();
}

// Exit: the last block of the launch publishes the epoch and resets the counter. Every block
// has read ctl[0] (begin) before it increments ctl[1], so no block of this launch can see the
// new epoch; kernel completion makes both words visible to the next launch on the stream.
COLL_DEV void end(const Team& t, const Block& blk) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned long long done = atomicAdd((unsigned long long*)&t.ctl[1], 1ull);
    if (done == (unsigned long long)gridDim.x - 1) {
      *(volatile uint64_t*)&t.ctl[1] = 0;
      *(volatile uint64_t*)&t.ctl[0] = blk.epoch;
    }
  }
}

// Waits until *flag >= e (acquire, system scope); false once timeout_ns passed since `start`.
COLL_DEV bool wait_ge(const uint64_t* flag, uint64_t e, uint64_t start, uint64_t timeout_ns) {
  // Spin (no sleep) for the first microseconds: these waits are on the latency path.
  for (unsigned polls = 0;; ++polls) {
    if (symheap::detail::ld_acquire(flag) >= e) return true;
    if ((polls & 15) == 15) {
      const uint64_t now = symheap::detail::globaltimer();
      if (now - start >= timeout_ns) return symheap::detail::ld_acquire(flag) >= e;
      if (now - start > 50000) {
        __nanosleep(128);
        if (SYMHEAP_GIVE_UP()) return symheap::detail::ld_acquire(flag) >= e;
      }
    }
  }
}

// The per-block cross-PE barrier, round `round` (0 or 1) of this launch: block b of every member
// arrives (stores the epoch into flag [round][b][me] of every other member, release at system
// scope) and waits until every other member's block b arrived (flag [round][b][j] >= epoch,
// acquire at system scope). See the ordering argument at the top of this file. Every thread
// returns true when all arrived; false (on every thread) after a timeout, when error 3 has been
// reported. n == 1: no waiting.
// `vb`: the block index whose flag slots are used (blockIdx.x, or blockIdx.x + gridDim.x for a
// third synchronisation in one launch: that slot belongs to no block of this launch).
template <bool RELEASE>
COLL_DEV bool sync_at(const Team& t, const Block& blk, int round, unsigned vb) {
  // SYMHEAP_COLL_WARP_FENCE: every thread also fences its own stores before the block barrier
  // (not needed by the PTX model, see the top of this file; costs ~3 us per round on H200).
#if SYMHEAP_COLL_WARP_FENCE
  if (RELEASE) symheap::fence();
#endif
  __syncthreads();
  if (t.n == 1) return true;
  const uint64_t e = blk.epoch;
  const size_t row = ((size_t)round * COLL_MAX_BLOCKS + vb) * (size_t)t.n;
  for (int j = threadIdx.x; j < t.n; j += blockDim.x) {
    if (j != t.me) {
      uint64_t* f = (uint64_t*)(uintptr_t)t.peer_flags[j] + row + t.me;
      if (RELEASE) {
        symheap::detail::st_release(f, e);
      } else {
        symheap::detail::st_relaxed((unsigned long long*)f, e);
      }
    }
  }
  bool ok = true;
  const uint64_t start = symheap::detail::globaltimer();
  for (int j = threadIdx.x; j < t.n && ok; j += blockDim.x) {
    if (j != t.me) ok = wait_ge(t.flags + row + j, e, start, t.timeout_ns);
  }
  ok = __syncthreads_and(ok) != 0;
  if (!ok && threadIdx.x == 0) report(t.error, SYMHEAP_ERR_COLL_TIMEOUT);
  return ok;
}
template <bool RELEASE>
COLL_DEV bool sync(const Team& t, const Block& blk, int round) {
  return sync_at<RELEASE>(t, blk, round, blockIdx.x);
}

// Round 0 of the kernels whose block stored nothing before it (entry barrier).
#ifndef SYMHEAP_COLL_RELAXED_ENTRY
#define SYMHEAP_COLL_RELAXED_ENTRY 0
#endif
COLL_DEV bool sync_entry(const Team& t, const Block& blk) {
  return sync<!SYMHEAP_COLL_RELAXED_ENTRY>(t, blk, 0);
}
COLL_DEV bool sync_release(const Team& t, const Block& blk, int round) {
  return sync<true>(t, blk, round);
}

// ---------------------------------------------------------------------------------------------
// Reduction loops. Src: `const S* operator()(int j)`, member j's source base (element 0 of the
// range); all sources are combined in order j = 0..n-1. Sink: `vec(i, v)` stores vector i of the
// range, `elem(i, s)` element i. Participant `rank` of `count`.
// ---------------------------------------------------------------------------------------------

// n == 2: U vectors i, i + count, ..., i + (U-1) * count of both sources are loaded together,
// then combined (member 0 first) and stored vector by vector.
template <typename D, int U, typename Src, typename Sink>
COLL_DEV void reduce_step2(const Src& src, const Sink& sink, int op, size_t i, size_t count) {
  typedef typename dtype<D>::A A;
  const int E = dtype<D>::E;
  v16 x[U];
  v16 y[U];
  const v16* s0 = (const v16*)src(0);
  const v16* s1 = (const v16*)src(1);
#pragma unroll
  for (int u = 0; u < U; ++u) x[u] = ld16(s0 + i + u * count);
#pragma unroll
  for (int u = 0; u < U; ++u) y[u] = ld16(s1 + i + u * count);
#pragma unroll
  for (int u = 0; u < U; ++u) {
    A acc[E];
    dtype<D>::unpack(x[u], acc);
    combine_vec<D>(acc, y[u], op);
    sink.vec(i + u * count, dtype<D>::pack(acc));
  }
}

// Any n: U vectors of each source; two sources' loads are issued together, then combined in
// member order into f32 (or i32) accumulators.
template <typename D, int U, typename Src, typename Sink>
COLL_DEV void reduce_stepn(const Src& src, const Sink& sink, int n, int op, size_t i,
                           size_t count) {
  typedef typename dtype<D>::A A;
  const int E = dtype<D>::E;
  A acc[U][E];
  v16 x[U];
  v16 y[U];
  {
    const v16* s0 = (const v16*)src(0);
#pragma unroll
    for (int u = 0; u < U; ++u) x[u] = ld16(s0 + i + u * count);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) dtype<D>::unpack(x[u], acc[u]);
  int j = 1;
  for (; j + 1 < n; j += 2) {
    const v16* sa = (const v16*)src(j);
    const v16* sb = (const v16*)src(j + 1);
#pragma unroll
    for (int u = 0; u < U; ++u) x[u] = ld16(sa + i + u * count);
#pragma unroll
    for (int u = 0; u < U; ++u) y[u] = ld16(sb + i + u * count);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      combine_vec<D>(acc[u], x[u], op);
      combine_vec<D>(acc[u], y[u], op);
    }
  }
  if (j < n) {
    const v16* sa = (const v16*)src(j);
#pragma unroll
    for (int u = 0; u < U; ++u) x[u] = ld16(sa + i + u * count);
#pragma unroll
    for (int u = 0; u < U; ++u) combine_vec<D>(acc[u], x[u], op);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) sink.vec(i + u * count, dtype<D>::pack(acc[u]));
}

// Vectors [0, nvec) of the range, grid-stride (participant `rank` of `count`).
template <typename D, int U2, typename Src, typename Sink>
COLL_DEV void reduce_vectors(const Src& src, const Sink& sink, int n, int op, size_t nvec,
                             size_t rank, size_t count) {
  size_t i = rank;
  if (n == 2) {
    const int U = U2;
    for (; i + (U - 1) * count < nvec; i += U * count) reduce_step2<D, U>(src, sink, op, i, count);
    for (; i < nvec; i += count) reduce_step2<D, 1>(src, sink, op, i, count);
  } else {
    const int U = unroll<D>::U;
    for (; i + (U - 1) * count < nvec; i += U * count) {
      reduce_stepn<D, U>(src, sink, n, op, i, count);
    }
    for (; i < nvec; i += count) reduce_stepn<D, 1>(src, sink, n, op, i, count);
  }
}

// Elements [lo, hi) of the range, one at a time.
template <typename D, typename Src, typename Sink>
COLL_DEV void reduce_elems(const Src& src, const Sink& sink, int n, int op, size_t lo, size_t hi,
                           size_t rank, size_t count) {
  typedef typename dtype<D>::A A;
  for (size_t i = lo + rank; i < hi; i += count) {
    A acc = dtype<D>::load(src(0) + i);
    for (int j = 1; j < n; ++j) acc = combine_rt(acc, dtype<D>::load(src(j) + i), op);
    sink.elem(i, acc);
  }
}

// Elements [0, len) of the range: vectors when `vec` (every source and destination 16-byte
// aligned), then the tail; else element by element.
template <typename D, int U2, typename Src, typename Sink>
COLL_DEV void reduce_range(const Src& src, const Sink& sink, int n, int op, size_t len, bool vec,
                           size_t rank, size_t count) {
  const size_t E = dtype<D>::E;
  size_t done = 0;
  if (vec) {
    const size_t nvec = len / E;
    reduce_vectors<D, U2>(src, sink, n, op, nvec, rank, count);
    done = nvec * E;
  }
  reduce_elems<D>(src, sink, n, op, done, len, rank, count);
}

// Stores into one local destination (base = element 0 of the range).
template <typename D>
struct LocalSink {
  typedef typename dtype<D>::S S;
  S* dst;
  COLL_DEV void vec(size_t i, const v16& v) const { st16((v16*)dst + i, v); }
  COLL_DEV void elem(size_t i, typename dtype<D>::A a) const { dtype<D>::store(dst + i, a); }
};

// Stores into the same range of every member's copy of `dst` (my pointer; member j's copy is
// dst + delta[j]), starting with the member after me so members spread their traffic.
template <typename D>
struct AllSink {
  typedef typename dtype<D>::S S;
  S* dst;
  const Block* blk;
  int me;
  int n;
  COLL_DEV void vec(size_t i, const v16& v) const {
    int j = me;
    for (int k = 0; k < n; ++k) {
      j = j + 1 == n ? 0 : j + 1;
      st16(at(*blk, (v16*)dst + i, j), v);
    }
  }
  COLL_DEV void elem(size_t i, typename dtype<D>::A a) const {
    for (int j = 0; j < n; ++j) dtype<D>::store(at(*blk, dst + i, j), a);
  }
};

// Member j's copy of the range starting at my pointer `base`.
template <typename D>
struct PeerSrc {
  typedef typename dtype<D>::S S;
  const S* base;
  const Block* blk;
  COLL_DEV const S* operator()(int j) const { return at(*blk, base, j); }
};

// ---------------------------------------------------------------------------------------------
// Byte copies to one or more destinations. Dst: `uint8_t* operator()(int k)`, destination k of
// nd (all congruent modulo 16 with each other). The source is loaded once and stored to every
// destination. Participant `rank` of `count`.
// ---------------------------------------------------------------------------------------------

template <int U, typename Dst>
COLL_DEV void copy_vectors(const v16* src, const Dst& dst, int nd, size_t head, size_t nvec,
                           size_t rank, size_t count) {
  size_t i = rank;
  for (; i + (U - 1) * count < nvec; i += U * count) {
    v16 x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) x[u] = ld16(src + i + u * count);
    for (int k = 0; k < nd; ++k) {
      v16* d = (v16*)(dst(k) + head);
#pragma unroll
      for (int u = 0; u < U; ++u) st16(d + i + u * count, x[u]);
    }
  }
  for (; i < nvec; i += count) {
    const v16 x = ld16(src + i);
    for (int k = 0; k < nd; ++k) st16((v16*)(dst(k) + head) + i, x);
  }
}

// `congruent`: every destination is congruent to destination 0 modulo 16.
template <typename Dst>
COLL_DEV void copy_out(const uint8_t* src, size_t bytes, const Dst& dst, int nd, bool congruent,
                       size_t rank, size_t count) {
  if (nd <= 0 || bytes == 0) return;
  if (congruent && (((uintptr_t)src ^ (uintptr_t)dst(0)) & 15) == 0) {
    size_t head = (16 - ((uintptr_t)src & 15)) & 15;
    if (head > bytes) head = bytes;
    for (size_t i = rank; i < head; i += count) {
      const uint8_t b = ld_u8(src + i);
      for (int k = 0; k < nd; ++k) st_u8(dst(k) + i, b);
    }
    const size_t nvec = (bytes - head) / 16;
    copy_vectors<SYMHEAP_COLL_UNROLL>((const v16*)(src + head), dst, nd, head, nvec, rank, count);
    for (size_t i = head + nvec * 16 + rank; i < bytes; i += count) {
      const uint8_t b = ld_u8(src + i);
      for (int k = 0; k < nd; ++k) st_u8(dst(k) + i, b);
    }
  } else {
    // Not congruent modulo 16: the header's copy picks the widest word each pair allows.
    for (int k = 0; k < nd; ++k) {
      symheap::detail::copy_bytes_inline(dst(k), src, bytes, rank, count);
    }
  }
}

// One destination.
struct OneDst {
  uint8_t* d;
  COLL_DEV uint8_t* operator()(int) const { return d; }
};

// ---------------------------------------------------------------------------------------------
// Kernels bodies.
// ---------------------------------------------------------------------------------------------

// One-shot all_reduce: the reduction of this block's range for one op. Sources: my own src for
// me, else member j's slot in my scratch (parity e & 1).
template <typename D>
struct OneShotSrc {
  typedef typename dtype<D>::S S;
  const S* src;
  const S* slots;
  size_t slot_elems;
  int me;
  COLL_DEV const S* operator()(int j) const { return j == me ? src : slots + j * slot_elems; }
};
// Member j's slot `me` (parity e & 1) at this block's range, for the n - 1 members j != me.
struct PushDst {
  const uint64_t* peer_scratch;
  size_t off;  // bytes from the start of a member's scratch
  int me, n;
  COLL_DEV uint8_t* operator()(int k) const {
    int j = me + 1 + k;
    if (j >= n) j -= n;
    return (uint8_t*)(uintptr_t)peer_scratch[j] + off;
  }
};

// ---------------------------------------------------------------------------------------------
// One-shot all_reduce, LL ("low latency") variant for small messages: the data carries its own
// flags, so no fence and no separate flag round trip is on the critical path. Every 8-byte word
// written to a peer is {flag:32, data:32} (st.volatile v2.u64: each 64-bit element is one single-
// copy-atomic access), flag = (epoch mod 2^32) | 1, never 0; the receiver polls its scratch until
// every word of a line carries this launch's flag, so the data word beside it is this launch's.
// Region: my data for member j goes to member j's scratch, parity e & 1, slot j (member j's OWN
// slot, which the plain path never writes: there member k writes slot k of the others), at
// sub-region me of size floor(slot_bytes / n / 16) * 16, 32 bytes per 16 bytes of data.
// Requires the scratch to be zeroed once when the team is created (so that no stale word carries
// a future flag); afterwards only this launch's flags match: a line of parity p was last written
// by launch e - 2k (k >= 1) of the same team, whose flag differs from e's below 2^32 launches.
// ---------------------------------------------------------------------------------------------

COLL_DEV void st_ll(void* p, uint32_t d0, uint32_t d1, uint32_t f) {
  const uint64_t a = ((uint64_t)f << 32) | d0;
  const uint64_t b = ((uint64_t)f << 32) | d1;
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}
COLL_DEV void ld_ll(const void* p, uint64_t& a, uint64_t& b) {
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
}
// Waits until both LL lines at `line` (32 bytes: 16 bytes of data) carry flag f; false after
// the timeout.
COLL_DEV bool poll_ll(const uint8_t* line, uint32_t f, v16& v, uint64_t start,
                      uint64_t timeout_ns) {
  for (unsigned polls = 0;; ++polls) {
    uint64_t a, b, c, d;
    ld_ll(line, a, b);
    ld_ll(line + 16, c, d);
    if ((uint32_t)(a >> 32) == f && (uint32_t)(b >> 32) == f && (uint32_t)(c >> 32) == f &&
        (uint32_t)(d >> 32) == f) {
      v.x = (uint32_t)a;
      v.y = (uint32_t)b;
      v.z = (uint32_t)c;
      v.w = (uint32_t)d;
      return true;
    }
    if ((polls & 15) == 15) {
      const uint64_t waited = symheap::detail::globaltimer() - start;
      if (waited >= timeout_ns || (waited > 50000 && SYMHEAP_GIVE_UP())) return false;
    }
  }
}

// Elements [first, count) (fewer than one vector) as a zero-padded vector, and back.
template <typename D>
COLL_DEV v16 load_tail(const typename dtype<D>::S* p, size_t first, size_t count) {
  const int E = dtype<D>::E;
  uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
  for (int k = 0; k < E; ++k) {
    if (first + k < count) {
      if (E == 8) {
        w[k / 2] |= (uint32_t)ld_u16(p + first + k) << (16 * (k & 1));
      } else {
        w[k] = ld_u32(p + first + k);
      }
    }
  }
  v16 v;
  v.x = w[0];
  v.y = w[1];
  v.z = w[2];
  v.w = w[3];
  return v;
}
template <typename D>
COLL_DEV void store_tail(typename dtype<D>::S* p, size_t first, size_t count, const v16& v) {
  const int E = dtype<D>::E;
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int k = 0; k < E; ++k) {
    if (first + k < count) {
      if (E == 8) {
        st_u16(p + first + k, (uint16_t)(w[k / 2] >> (16 * (k & 1))));
      } else {
        st_u32(p + first + k, w[k]);
      }
    }
  }
}

template <typename D>
COLL_DEV v16 load_vec_or_tail(const typename dtype<D>::S* src, size_t i, size_t full,
                              size_t count) {
  return i < full ? ld16((const v16*)src + i) : load_tail<D>(src, i * dtype<D>::E, count);
}

// Vectors [v0, v1) of this block (vector i = elements [i * E, i * E + E) of the message).
// Member j's contribution to me starts at its src + me * stride (stride 0: all_reduce, every
// member gets the whole src; stride == count: reduce_scatter, member j gets block j).
template <typename D>
COLL_DEV void oneshot_ll(const typename dtype<D>::S* src, typename dtype<D>::S* dst, size_t count,
                         size_t stride, bool aligned, int op, const uint64_t* peer_scratch,
                         const uint8_t* scratch, size_t slot_bytes, size_t sub, const Team& t,
                         const Block& blk, size_t v0, size_t v1) {
  typedef typename dtype<D>::A A;
  const int E = dtype<D>::E;
  const size_t full = aligned ? count / E : 0;  // vectors loaded / stored whole
  const uint32_t f = (uint32_t)blk.epoch | 1u;
  const size_t par = (size_t)(blk.epoch & 1);
  // Push: my vector i to line pair i of sub-region me of slot j of every member j's scratch.
  // (Reloading src here and below, rather than keeping the prefetched vector in registers across
  // the loops, measured 0.15 - 1 us faster on H200.)
  for (size_t i = v0 + threadIdx.x; i < v1; i += blockDim.x) {
    v16 v;
    for (int k = 1; k < t.n; ++k) {
      int j = t.me + k;
      if (j >= t.n) j -= t.n;
      // all_reduce loads its vector once for every peer; reduce_scatter each peer's own.
      if (k == 1 || stride != 0) v = load_vec_or_tail<D>(src + j * stride, i, full, count);
      uint8_t* line = (uint8_t*)(uintptr_t)peer_scratch[j] + (par * t.n + j) * slot_bytes +
                      (size_t)t.me * sub + 32 * i;
      st_ll(line, v.x, v.y, f);
      st_ll(line + 16, v.z, v.w, f);
    }
  }
  // Receive and reduce in member order.
  const uint8_t* mine = scratch + (par * t.n + t.me) * slot_bytes;
  const uint64_t start = symheap::detail::globaltimer();
  const typename dtype<D>::S* mine_src = src + (size_t)t.me * stride;
  for (size_t i = v0 + threadIdx.x; i < v1; i += blockDim.x) {
    const v16 own = load_vec_or_tail<D>(mine_src, i, full, count);
    A acc[dtype<D>::E];
    bool ok = true;
    for (int j = 0; j < t.n && ok; ++j) {
      v16 v = own;
      if (j != t.me) ok = poll_ll(mine + (size_t)j * sub + 32 * i, f, v, start, t.timeout_ns);
      if (j == 0) {
        dtype<D>::unpack(v, acc);
      } else {
        combine_vec<D>(acc, v, op);
      }
    }
    if (!ok) {
      report(t.error, SYMHEAP_ERR_COLL_TIMEOUT);
      break;
    }
    if (valid_op(op)) {
      const v16 r = dtype<D>::pack(acc);
      if (i < full) {
        st16((v16*)dst + i, r);
      } else {
        store_tail<D>(dst, i * E, count, r);
      }
    }
  }
}

// Flag slot q (0 <= q < 2 x COLL_MAX_BLOCKS) of a member's flag area: the area is
// [2 rounds][COLL_MAX_BLOCKS][n], so slot q is round q / COLL_MAX_BLOCKS, block q mod it.
COLL_DEV size_t slot_row(size_t q, int n) { return q * (size_t)n; }

// Elements [a, b) of every peer's contribution into slot `me` of that peer's scratch (`off`:
// bytes from the scratch base to element 0 of slot me, this parity). Peer j's contribution
// starts at src + j * stride (0: the same src for all).
template <typename D>
COLL_DEV void push_range(const typename dtype<D>::S* src, size_t stride, size_t a, size_t b,
                         const uint64_t* peer_scratch, size_t off, const Team& t, bool vec,
                         size_t rank, size_t count) {
  typedef typename dtype<D>::S S;
  const size_t bytes = (b - a) * sizeof(S);
  if (stride == 0) {
    copy_out((const uint8_t*)(src + a), bytes,
             PushDst{peer_scratch, off + a * sizeof(S), t.me, t.n}, t.n - 1, vec, rank, count);
    return;
  }
  for (int k = 1; k < t.n; ++k) {
    int j = t.me + k;
    if (j >= t.n) j -= t.n;
    copy_out((const uint8_t*)(src + j * stride + a), bytes,
             OneDst{(uint8_t*)(uintptr_t)peer_scratch[j] + off + a * sizeof(S)}, 1, vec, rank,
             count);
  }
}

// The one-shot's flag path: push this block's range into the peers' scratch, one round, reduce.
template <typename D>
COLL_DEV void oneshot_flag(const typename dtype<D>::S* src, typename dtype<D>::S* dst,
                           uint64_t count, uint64_t stride, int op, const uint64_t* peer_scratch,
                           uint64_t* scratch, uint64_t slot_bytes, bool ll_ok, const Team& t,
                           const Block& blk) {
  typedef typename dtype<D>::S S;
  const size_t E = dtype<D>::E;
  const size_t nvec_total = (count + E - 1) / E;
  const bool stride_vec = ((size_t)stride * sizeof(S)) % 16 == 0;
  // This block's contiguous range, a multiple of E elements (the last one takes the tail).
  const size_t per = (nvec_total + gridDim.x - 1) / gridDim.x * E;
  size_t lo = (size_t)blockIdx.x * per;
  if (lo > count) lo = count;
  size_t hi = lo + per;
  if (hi > count) hi = count;
  const size_t slot_elems = slot_bytes / sizeof(S);
  const size_t parity_off = (size_t)(blk.epoch & 1) * (size_t)t.n * slot_elems;
  const bool vec = ll_ok && aligned16(src) && aligned16(dst) && stride_vec;
  const size_t push_off = (parity_off + (size_t)t.me * slot_elems) * sizeof(S);
  const S* slots = (const S*)scratch + parity_off;
  // Push my range of every peer's contribution into slot `me` of parity e & 1 of its scratch.
  if (t.n > 1) {
    push_range<D>(src, stride, lo, hi, peer_scratch, push_off, t, vec, threadIdx.x, blockDim.x);
  }
  // One round: every member's push of this block's range has landed in my scratch.
  if (sync_release(t, blk, 0) && valid_op(op)) {
    reduce_range<D, SYMHEAP_COLL_UNROLL_ONESHOT>(
        OneShotSrc<D>{src + (size_t)t.me * stride + lo, slots + lo, slot_elems, t.me},
        LocalSink<D>{dst + lo}, t.n, op, hi - lo, vec, threadIdx.x, blockDim.x);
  }
  // Double buffering makes an exit round unnecessary: member j writes my scratch[e & 1] at launch
  // e only after it has finished its launch e - 1, which waited for my signals of e - 1; I send
  // those only after my launch e - 2 (the last reader of scratch[e & 1]) completed, since
  // launches on a stream run in order and every collective on the team waits for every member
  // before it ends (directly, through the root of a push broadcast, which waited for everyone
  // first, or through the arrival flags of an LL broadcast). A launch of any collective in
  // between counts (epochs are per team, not per kernel), and the argument needs no block
  // correspondence, so grids and counts may differ between launches. In place (dst == my
  // contribution) is safe: peers never read my src (they read their own scratch), and each
  // thread reads src[i] (and the slots) before it stores dst[i] for the same i.
}

// One-shot all_reduce (stride 0) and reduce_scatter (stride == count: member j's src holds
// n blocks of count elements, block k for member k), LL path: the launcher's choice for small
// messages (0 < bytes). Needs room for the LL lines in the scratch (32 * ceil(bytes / 16) <=
// slot_bytes / n rounded down to 16), n > 1 and count > 0 (a launch without data would not wait
// for anyone, which the scratch's double buffering relies on); else every member reports
// error 4 and touches nothing. Larger messages go to ar_flag.
#define SYMHEAP_ERR_COLL_LAUNCH 4u
template <typename D>
COLL_DEV void ar_oneshot(const typename dtype<D>::S* src, typename dtype<D>::S* dst, uint64_t count,
                         uint64_t stride, int op, const uint64_t* peer_scratch, uint64_t* scratch,
                         uint64_t slot_bytes, const Team& t) {
  typedef typename dtype<D>::S S;
  __shared__ Block blk;
  const size_t E = dtype<D>::E;
  // Loads issued together before the entry __syncthreads (one memory latency instead of three
  // on the small-message path): the epoch, the scratch table and this thread's first vector.
  const uint64_t ctl0 = *(volatile const uint64_t*)&t.ctl[0];
  bool ll_ok = aligned16(scratch) && (slot_bytes & 15) == 0;
  for (int j = 0; j < t.n; ++j) ll_ok = ll_ok && aligned16((const void*)(uintptr_t)peer_scratch[j]);
  const size_t nvec_total = (count + E - 1) / E;
  const size_t sub = (size_t)(slot_bytes / t.n) & ~(size_t)15;
  if (!(ll_ok && t.n > 1 && count > 0 && nvec_total * 32 <= sub)) {
    begin_epoch(blk, ctl0);
    if (threadIdx.x == 0) report(t.error, SYMHEAP_ERR_COLL_LAUNCH);
    end(t, blk);
    return;
  }
  const size_t vper = (nvec_total + gridDim.x - 1) / gridDim.x;
  size_t v0 = (size_t)blockIdx.x * vper;
  if (v0 > nvec_total) v0 = nvec_total;
  const size_t v1 = v0 + vper < nvec_total ? v0 + vper : nvec_total;
  const bool aligned =
      aligned16(src) && aligned16(dst) && ((size_t)stride * sizeof(S)) % 16 == 0;
  // Prefetch (the loads are volatile asm: kept although the value is not used).
  if (v0 + threadIdx.x < v1) {
    (void)load_vec_or_tail<D>(src, v0 + threadIdx.x, aligned ? count / E : 0, count);
  }
  begin_epoch(blk, ctl0);
  oneshot_ll<D>(src, dst, count, stride, aligned, op, peer_scratch, (const uint8_t*)scratch,
                slot_bytes, sub, t, blk, v0, v1);
  end(t, blk);
}

// The one-shot's flag path (symheap_ar_flag_*: what the launcher uses above the LL sizes, and
// for empty messages or a team of one).
template <typename D>
COLL_DEV void ar_flag(const typename dtype<D>::S* src, typename dtype<D>::S* dst, uint64_t count,
                      uint64_t stride, int op, const uint64_t* peer_scratch, uint64_t* scratch,
                      uint64_t slot_bytes, const Team& t) {
  __shared__ Block blk;
  begin_epoch(blk, *(volatile const uint64_t*)&t.ctl[0]);
  bool ok = aligned16(scratch) && (slot_bytes & 15) == 0;
  for (int j = 0; j < t.n; ++j) ok = ok && aligned16((const void*)(uintptr_t)peer_scratch[j]);
  oneshot_flag<D>(src, dst, count, stride, op, peer_scratch, scratch, slot_bytes, ok, t, blk);
  end(t, blk);
}

// ---------------------------------------------------------------------------------------------
// One-shot all_reduce / reduce_scatter, LL128 variant for mid-size messages (above the LL sizes):
// data and flags together as in LL, but one 8-byte flag per 128-byte line instead of one per
// 8 bytes, so the link carries 128/120 of the data instead of twice it.
// A warp step moves 480 data bytes as 4 lines of 128 bytes, each line written by 8 lanes with
// one 16-byte volatile store each (one store instruction for the warp); lane 7 of each line
// stores 8 data bytes and the flag (this launch's epoch, never 0). Lane l of the step holds data
// bytes [16 (7 q + k), +16) (k = l mod 8 < 7, q = l / 8) or, for k = 7, [448 + 8 q, +8), so every
// data access is an aligned vector.
// What makes one flag per line enough is a property of the hardware path, not of the PTX memory
// model, which NCCL's LL128 protocol relies on as well (NCCL turns it on by default only where it
// verified it: NVLink between sm_70 / sm_80 / sm_90 GPUs): the 128 bytes a warp stores to one
// aligned line in one instruction are not split and land in ascending address order, so the
// flag (the line's last 8 bytes) lands last. A reader polls with the whole warp until every flag
// lane sees this launch's flag, and only then loads the data, so that every data load is issued
// after the flag was seen (skipping that second load, i.e. taking the data from the polling
// load, measured 0.2 to 0.4 us faster on H200, but it would also rely on one warp load of a
// line being a single snapshot).
// Checked on 2 x H200 by the exact-value tests (selftest --gpu at 2 and 4 PEs, every launch
// verified, CUDA-graph replays).
// Region (offset ll_off from every member's scratch base, two parities of `part` bytes): member
// me's lines for member j go to sub-region (me - j - 1) mod n of j's region, of
// floor(part / (n - 1) / 128) x 128 bytes; a region of its own, since another path's stale data
// could match a flag here (plain data) or LL could take these lines for its own (LL128 data).
// Zeroed once at team creation; flags are epochs, which only grow, so a stale line never
// carries this launch's flag. Double buffering as in the flag path (see oneshot_flag).
// Requires n > 1, count > 0, src, dst and stride x sizeof(T) 16-byte aligned, and
// 512 x ceil(bytes / 480) <= the sub-region; else every member reports error 4 and touches
// nothing.
// ---------------------------------------------------------------------------------------------

#define COLL_LL128_STEP_DATA 480
#define COLL_LL128_STEP_WIRE 512

COLL_DEV void st_ll128(void* p, uint64_t a, uint64_t b) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}
COLL_DEV uint64_t lo64(const v16& v) { return ((uint64_t)v.y << 32) | v.x; }
COLL_DEV uint64_t hi64(const v16& v) { return ((uint64_t)v.w << 32) | v.z; }
COLL_DEV v16 words_to_v16(uint64_t a, uint64_t b) {
  v16 v;
  v.x = (uint32_t)a;
  v.y = (uint32_t)(a >> 32);
  v.z = (uint32_t)b;
  v.w = (uint32_t)(b >> 32);
  return v;
}
// 8 aligned bytes as the lower half of a vector (upper half zero), and back.
COLL_DEV v16 ld8(const void* p) {
  v16 v;
  asm volatile("ld.global.cg.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  v.z = 0;
  v.w = 0;
  return v;
}
COLL_DEV void st8(void* p, const v16& v) {
  asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(v.x), "r"(v.y) : "memory");
}

// Where lane `lane` of a warp step keeps its data: bytes [off, off + len) of the step's 480
// (see the top of this section). The flag lanes (lane mod 8 == 7) hold 8 bytes.
COLL_DEV unsigned ll128_piece_off(unsigned lane) {
  return (lane & 7) == 7 ? 448 + 8 * (lane >> 3) : 16 * (7 * (lane >> 3) + (lane & 7));
}
COLL_DEV unsigned ll128_piece_len(unsigned lane) { return (lane & 7) == 7 ? 8 : 16; }

// Of the steps s0, s0 + warps, ..., s0 + (u_max - 1) warps, how many are below nsteps.
COLL_DEV int ll128_batch(unsigned s0, unsigned nsteps, unsigned warps, int u_max) {
  return (int)min((nsteps - s0 + warps - 1) / warps, (unsigned)u_max);
}

// Elements [first, first + m) of p (m = 8 or 16 bytes' worth), those below `count`, as a
// zero-padded vector (the upper half stays zero for an 8-byte piece); and back.
template <typename D>
COLL_DEV v16 load_piece(const typename dtype<D>::S* p, size_t first, unsigned m, size_t count) {
  if (first + m <= count) {
    return m == dtype<D>::E ? ld16(p + first) : ld8(p + first);
  }
  return load_tail<D>(p, first, first + m < count ? first + m : count);
}
template <typename D>
COLL_DEV void store_piece(typename dtype<D>::S* p, size_t first, unsigned m, size_t count,
                          const v16& v) {
  if (first + m <= count) {
    if (m == dtype<D>::E) {
      st16(p + first, v);
    } else {
      st8(p + first, v);
    }
    return;
  }
  store_tail<D>(p, first, first + m < count ? first + m : count, v);
}

// Steps of one warp handled together (their loads in flight at once, one wait for all). 1, 2
// and 4 measured on 2 x H200: 2 within 0.2 us of 1 either way from 512 KiB to 4 MiB, 4 slower.
#ifndef SYMHEAP_COLL_LL128_UNROLL
#define SYMHEAP_COLL_LL128_UNROLL 1
#endif

// Waits (with the whole warp) until every flag lane sees flag e in its line of the first
// `lines` (warp-uniform, <= U) of the lines p, p + gap, ..., p + (U - 1) gap; false on every lane
// after the timeout. The caller loads the data afterwards (see the top of this section).
template <int U>
COLL_DEV bool wait_ll128(const uint8_t* p, size_t gap, int lines, uint64_t e, bool flag_lane,
                         uint64_t start, uint64_t timeout_ns) {
  for (unsigned polls = 0;; ++polls) {
    bool missing = false;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u < lines) {
        uint64_t a, b;
        ld_ll(p + u * gap, a, b);
        missing = missing || (flag_lane && b != e);
      }
    }
    if (!__any_sync(0xffffffffu, missing)) return true;
    if ((polls & 15) == 15) {
      const uint64_t waited = symheap::detail::globaltimer() - start;
      if (__any_sync(0xffffffffu, waited >= timeout_ns || (waited > 50000 && SYMHEAP_GIVE_UP()))) {
        return false;
      }
    }
  }
}
COLL_DEV v16 ld_line(const uint8_t* p) {
  uint64_t a, b;
  ld_ll(p, a, b);
  return words_to_v16(a, b);
}

template <typename D>
COLL_DEV void ar_ll128(const typename dtype<D>::S* src, typename dtype<D>::S* dst, uint64_t count,
                       uint64_t stride, int op, const uint64_t* peer_scratch, uint64_t* scratch,
                       uint64_t ll_off, uint64_t part, const Team& t) {
  typedef typename dtype<D>::S S;
  typedef typename dtype<D>::A A;
  const int U = SYMHEAP_COLL_LL128_UNROLL;
  __shared__ Block blk;
  const uint64_t ctl0 = *(volatile const uint64_t*)&t.ctl[0];
  const size_t bytes = (size_t)count * sizeof(S);
  const size_t steps = (bytes + COLL_LL128_STEP_DATA - 1) / COLL_LL128_STEP_DATA;
  const size_t sub = t.n > 1 ? (size_t)(part / (uint64_t)(t.n - 1)) & ~(size_t)127 : 0;
  bool ok = t.n > 1 && count > 0 && steps * COLL_LL128_STEP_WIRE <= sub && steps < (1u << 30) &&
            aligned16(src) && aligned16(dst) && ((size_t)stride * sizeof(S)) % 16 == 0 &&
            ((uintptr_t)scratch & 127) == 0 && (ll_off & 127) == 0 && (part & 127) == 0;
  for (int j = 0; j < t.n; ++j) ok = ok && ((peer_scratch[j] & 127) == 0);
  begin_epoch(blk, ctl0);
  if (!ok) {
    if (threadIdx.x == 0) report(t.error, SYMHEAP_ERR_COLL_LAUNCH);
    end(t, blk);
    return;
  }
  const uint64_t e = blk.epoch;
  const size_t par_off = ll_off + (size_t)(e & 1) * part;
  const unsigned lane = threadIdx.x & 31;
  const bool flag_lane = (lane & 7) == 7;
  // This lane's piece of a step: offset and length in elements.
  const unsigned poff = ll128_piece_off(lane) / sizeof(S);
  const unsigned m = ll128_piece_len(lane) / sizeof(S);
  // 32-bit step indices (steps * 512 fits the region, checked above): fewer registers.
  const unsigned nsteps = (unsigned)steps;
  const unsigned warps = gridDim.x * (blockDim.x >> 5);
  const unsigned w0 = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const size_t step_elems = COLL_LL128_STEP_DATA / sizeof(S);
  const size_t gap = (size_t)warps * COLL_LL128_STEP_WIRE;  // between a warp's consecutive steps
  // Push: my pieces of U steps at a time (loads first, then the stores) to every peer.
  for (unsigned s0 = w0; s0 < nsteps; s0 += U * warps) {
    const int lines = ll128_batch(s0, nsteps, warps, U);
    v16 v[U];
    for (int k = 1; k < t.n; ++k) {
      int j = t.me + k;
      if (j >= t.n) j -= t.n;
      // all_reduce loads its pieces once for every peer; reduce_scatter each peer's own.
      if (k == 1 || stride != 0) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (u < lines) {
            const size_t first = (size_t)(s0 + u * warps) * step_elems + poff;
            v[u] = load_piece<D>(src + j * stride, first, m, count);
          }
        }
      }
      // Sub-region of the sender me at member j: (me - j - 1) mod n = n - k - 1.
      uint8_t* line = (uint8_t*)(uintptr_t)(peer_scratch[j] + par_off) +
                      (size_t)(t.n - 1 - k) * sub + (size_t)s0 * COLL_LL128_STEP_WIRE + 16 * lane;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (u < lines) st_ll128(line + u * gap, lo64(v[u]), flag_lane ? e : hi64(v[u]));
      }
    }
  }
  // Receive: wait for U steps of every peer, then reduce them in member order.
  const uint8_t* mine = (const uint8_t*)scratch + par_off + 16 * lane;
  const S* own_src = src + (size_t)t.me * stride;
  const uint64_t start = symheap::detail::globaltimer();
  for (unsigned s0 = w0; s0 < nsteps; s0 += U * warps) {
    const int lines = ll128_batch(s0, nsteps, warps, U);
    v16 own[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u < lines) {
        own[u] = load_piece<D>(own_src, (size_t)(s0 + u * warps) * step_elems + poff, m, count);
      }
    }
    bool got = true;
    for (int j = 0; j < t.n && got; ++j) {
      if (j == t.me) continue;
      // Member j's lines are in my sub-region (j - me - 1) mod n.
      int r = j - t.me - 1;
      if (r < 0) r += t.n;
      got = wait_ll128<U>(mine + (size_t)r * sub + (size_t)s0 * COLL_LL128_STEP_WIRE, gap, lines, e,
                          flag_lane, start, t.timeout_ns);
    }
    if (!got) {
      if (lane == 0) report(t.error, SYMHEAP_ERR_COLL_TIMEOUT);
      break;
    }
    if (!valid_op(op)) continue;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u < lines) {
        A acc[dtype<D>::E];
        for (int j = 0; j < t.n; ++j) {
          v16 v = own[u];
          if (j != t.me) {
            int r = j - t.me - 1;
            if (r < 0) r += t.n;
            v = ld_line(mine + (size_t)r * sub + (size_t)(s0 + u * warps) * COLL_LL128_STEP_WIRE);
          }
          if (j == 0) {
            dtype<D>::unpack(v, acc);
          } else {
            combine_vec<D>(acc, v, op);
          }
        }
        const size_t first = (size_t)(s0 + u * warps) * step_elems + poff;
        store_piece<D>(dst, first, m, count, dtype<D>::pack(acc));
      }
    }
  }
  end(t, blk);
}

// Two members, dst and src disjoint, large messages: a two-shot that moves data over NVLink
// with stores only (peer reads are slower than peer writes: measured 344 vs 363 GB/s on H200).
// Chunk j (j = 0, 1) belongs to member j. Round 0 (entry); each block pushes its grid-stride
// share of my src chunk `peer` into the peer's dst chunk `peer` (free until the peer's result
// lands there); round 1 (the peer's share for this block landed in my dst chunk me); the block
// reduces src chunk me with that contribution in member order (both local), stores the result
// into my dst chunk me (in place over the contribution: same thread, load before store) and the
// peer's dst chunk me (which the peer never uses before the end); third round (exit), on the
// flag slots of block blockIdx.x + gridDim.x (hence gridDim.x <= 512). Both members use the same
// grid-stride mapping, so block b reduces exactly what the peer's block b pushed.
#ifndef SYMHEAP_COLL_PUSH2_MIN
#define SYMHEAP_COLL_PUSH2_MIN (16 << 20)
#endif

template <typename D>
struct Push2Src {
  typedef typename dtype<D>::S S;
  const S* src;  // my src, chunk me
  const S* dst;  // my dst, chunk me: the peer's contribution
  int me;
  COLL_DEV const S* operator()(int j) const { return j == me ? src : dst; }
};

template <typename D>
COLL_DEV void ar_push2(const typename dtype<D>::S* src, typename dtype<D>::S* dst, size_t count,
                       int op, const Team& t, const Block& blk, size_t chunk) {
  const size_t E = dtype<D>::E;
  const int peer = 1 - t.me;
  const size_t lo = t.me == 0 ? 0 : chunk;
  const size_t hi = t.me == 0 ? chunk : count;
  const size_t plo = peer == 0 ? 0 : chunk;
  const size_t phi = peer == 0 ? chunk : count;
  const size_t rank = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t cnt = (size_t)gridDim.x * blockDim.x;
  if (!sync_entry(t, blk)) return;
  copy_vectors<SYMHEAP_COLL_UNROLL>((const v16*)(src + plo),
                                    OneDst{(uint8_t*)at(blk, dst + plo, peer)}, 1, 0,
                                    (phi - plo) / E, rank, cnt);
  if (!sync_at<true>(t, blk, 1, blockIdx.x)) return;
  if (valid_op(op)) {
    reduce_vectors<D, SYMHEAP_COLL_UNROLL>(Push2Src<D>{src + lo, dst + lo, t.me},
                                           AllSink<D>{dst + lo, &blk, t.me, 2}, 2, op,
                                           (hi - lo) / E, rank, cnt);
  }
  sync_at<true>(t, blk, 0, blockIdx.x + gridDim.x);
}

// Two-shot all_reduce. In place (dst == src) is correct: element i of chunk me is read (from
// every member's src) only by the one thread of member me that owns it, and that thread stores
// element i to every member's dst after it loaded all of them; other members read and write only
// their own chunks, and round 1 keeps every member's src readable until every load is done.
template <typename D>
COLL_DEV void ar_twoshot(const typename dtype<D>::S* src, typename dtype<D>::S* dst, uint64_t count,
                         int op, const Team& t) {
  __shared__ Block blk;
  begin(t, blk);
  const size_t E = dtype<D>::E;
  // Chunk size: ceil(count / n) rounded up to a whole number of 16-byte vectors.
  const size_t chunk = ((count + t.n - 1) / t.n + E - 1) / E * E;
  size_t lo = (size_t)t.me * chunk;
  if (lo > count) lo = count;
  size_t hi = lo + chunk;
  if (hi > count) hi = count;
  const bool vec = aligned16(src) && aligned16(dst) && blk.deltas_aligned;
  const bool disjoint = src + count <= dst || dst + count <= src;
  if (t.n == 2 && vec && disjoint && count % E == 0 && gridDim.x <= COLL_MAX_BLOCKS / 2 &&
      count * sizeof(typename dtype<D>::S) >= (size_t)SYMHEAP_COLL_PUSH2_MIN) {
    ar_push2<D>(src, dst, count, op, t, blk, chunk);
    end(t, blk);
    return;
  }
  // Round 0: every member's src is ready and its dst free.
  if (sync_entry(t, blk)) {
    if (valid_op(op)) {
      const size_t rank = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
      const size_t cnt = (size_t)gridDim.x * blockDim.x;
      reduce_range<D, SYMHEAP_COLL_UNROLL>(PeerSrc<D>{src + lo, &blk},
                                           AllSink<D>{dst + lo, &blk, t.me, t.n}, t.n, op, hi - lo,
                                           vec, rank, cnt);
    }
    // Round 1: every push into my dst is done and nobody reads my src any more.
    sync_release(t, blk, 1);
  }
  end(t, blk);
}

// reduce_scatter. In place (dst == src + me * count) is correct: the block src[me * count ..] of
// my src is read only by my own threads (every other member reads its own block of every src),
// each thread reads element i of every member before it stores dst[i]; round 1 keeps my src
// readable until every member finished reading its block of it.
template <typename D>
COLL_DEV void reduce_scatter(const typename dtype<D>::S* src, typename dtype<D>::S* dst,
                             uint64_t count, int op, const Team& t) {
  __shared__ Block blk;
  begin(t, blk);
  const typename dtype<D>::S* mine = src + (size_t)t.me * count;
  const bool vec = aligned16(mine) && aligned16(dst) && blk.deltas_aligned;
  if (sync_entry(t, blk)) {
    if (valid_op(op)) {
      const size_t rank = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
      const size_t cnt = (size_t)gridDim.x * blockDim.x;
      reduce_range<D, SYMHEAP_COLL_UNROLL>(PeerSrc<D>{mine, &blk}, LocalSink<D>{dst}, t.n, op,
                                           count, vec, rank, cnt);
    }
    sync_release(t, blk, 1);
  }
  end(t, blk);
}

// Member j's copy of a range starting at my pointer `base`, for m destinations k = 0..m-1:
// members me + 1 + ((k + rot) mod m) (mod n), i.e. every member (m == n) or every member but me
// (m == n - 1), starting at a per-block rotation so members and blocks spread their traffic.
struct MembersDst {
  uint8_t* base;
  const Block* blk;
  int me, n, m, rot;  // 0 <= rot < m
  COLL_DEV uint8_t* operator()(int k) const {
    int r = k + rot;
    if (r >= m) r -= m;
    int j = me + 1 + r;
    if (j >= n) j -= n;
    return at(*blk, base, j);
  }
};

}  // namespace coll

using coll::Team;

// =============================================================================================
// Kernels
// =============================================================================================

// One-shot all_reduce (latency path; stride 0) and one-shot reduce_scatter (stride == count:
// src holds n blocks of count elements, block j for member j; dst gets count elements). scratch:
// my symmetric scratch [2 parities][n slots][slot_bytes]; peer_scratch[j]: member j's scratch
// base. count * sizeof(T) <= slot_bytes.
#define COLL_ONESHOT(SUFFIX, D, S)                                                          \
  extern "C" __global__ void __launch_bounds__(1024) symheap_ar_oneshot_##SUFFIX(           \
      const S* src, S* dst, uint64_t count, uint64_t stride, int op,                        \
      const uint64_t* peer_scratch, uint64_t* scratch, uint64_t slot_bytes,                 \
      COLL_TEAM_PARAMS) {                                                                   \
    coll::ar_oneshot<D>(src, dst, count, stride, op, peer_scratch, scratch, slot_bytes,     \
                        COLL_TEAM);                                                         \
  }

// The one-shot's flag path (the launcher's choice above the LL sizes): the same arguments.
#define COLL_FLAG(SUFFIX, D, S)                                                                \
  extern "C" __global__ void __launch_bounds__(1024) symheap_ar_flag_##SUFFIX(                 \
      const S* src, S* dst, uint64_t count, uint64_t stride, int op,                           \
      const uint64_t* peer_scratch, uint64_t* scratch, uint64_t slot_bytes,                    \
      COLL_TEAM_PARAMS) {                                                                      \
    coll::ar_flag<D>(src, dst, count, stride, op, peer_scratch, scratch, slot_bytes, COLL_TEAM); \
  }

// The one-shot's LL128 path (mid-size messages): scratch is my scratch base, the LL128 region
// starts ll_off bytes into every member's scratch, `part` bytes per parity.
#define COLL_LL128(SUFFIX, D, S)                                                              \
  extern "C" __global__ void __launch_bounds__(1024) symheap_ar_ll128_##SUFFIX(               \
      const S* src, S* dst, uint64_t count, uint64_t stride, int op,                          \
      const uint64_t* peer_scratch, uint64_t* scratch, uint64_t ll_off, uint64_t part,        \
      COLL_TEAM_PARAMS) {                                                                     \
    coll::ar_ll128<D>(src, dst, count, stride, op, peer_scratch, scratch, ll_off, part,       \
                      COLL_TEAM);                                                             \
  }

// Two-shot all_reduce (bandwidth path), no scratch.
#define COLL_TWOSHOT(SUFFIX, D, S)                                                \
  extern "C" __global__ void __launch_bounds__(1024) symheap_ar_twoshot_##SUFFIX( \
      const S* src, S* dst, uint64_t count, int op, COLL_TEAM_PARAMS) {           \
    coll::ar_twoshot<D>(src, dst, count, op, COLL_TEAM);                          \
  }

// reduce_scatter: src holds n * count elements; dst[i] = reduce_j member j's src[me * count + i].
#define COLL_REDUCE_SCATTER(SUFFIX, D, S)                                             \
  extern "C" __global__ void __launch_bounds__(1024) symheap_reduce_scatter_##SUFFIX( \
      const S* src, S* dst, uint64_t count, int op, COLL_TEAM_PARAMS) {               \
    coll::reduce_scatter<D>(src, dst, count, op, COLL_TEAM);                          \
  }

#define COLL_REDUCTIONS(SUFFIX, D, S) \
  COLL_ONESHOT(SUFFIX, D, S)          \
  COLL_FLAG(SUFFIX, D, S)             \
  COLL_LL128(SUFFIX, D, S)            \
  COLL_TWOSHOT(SUFFIX, D, S)          \
  COLL_REDUCE_SCATTER(SUFFIX, D, S)

COLL_REDUCTIONS(f32, float, float)
COLL_REDUCTIONS(f16, coll::f16, uint16_t)
COLL_REDUCTIONS(bf16, coll::bf16, uint16_t)
COLL_REDUCTIONS(i32, int32_t, int32_t)

// all_gather: round 0; my `bytes` from src go to dst + me * bytes of every member (self too,
// unless src == dst + me * bytes); round 1.
extern "C" __global__ void __launch_bounds__(1024)
    symheap_allgather(const uint8_t* src, uint8_t* dst, uint64_t bytes, COLL_TEAM_PARAMS) {
  const Team t = COLL_TEAM;
  __shared__ coll::Block blk;
  coll::begin(t, blk);
  uint8_t* mine = dst + (size_t)me * bytes;
  const bool in_place = mine == src;
  if (coll::sync_entry(t, blk)) {
    const size_t rank = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t cnt = (size_t)gridDim.x * blockDim.x;
    const int m = in_place ? n - 1 : n;
    const int rot = m > 0 ? (int)(blockIdx.x % (unsigned)m) : 0;
    coll::copy_out(src, bytes, coll::MembersDst{mine, &blk, me, n, m, rot}, m,
                   blk.deltas_aligned != 0, rank, cnt);
    coll::sync_release(t, blk, 1);
  }
  coll::end(t, blk);
}

// broadcast, push (SYMHEAP_COLL_BCAST_PUSH, default): block b of every other member tells the
// root that its dst is free (stream order: every earlier kernel of that member has finished) by
// storing the epoch into the root's flag [0][b][me]; root block b waits for all of them, stores
// its grid-stride share of src into every member's dst (its own too unless dst == src), then
// releases flag [1][b][root] of every member, which member block b waits for. Two one-way
// latencies on the critical path and no exit round; the root returns without waiting for acks.
// Pull (SYMHEAP_COLL_BCAST_PUSH=0): round 0; every member (root too, unless dst == src) pulls
// root's src into its own dst; round 1.
#ifndef SYMHEAP_COLL_BCAST_PUSH
#define SYMHEAP_COLL_BCAST_PUSH 1
#endif
extern "C" __global__ void __launch_bounds__(1024)
    symheap_broadcast(const uint8_t* src, uint8_t* dst, uint64_t bytes, int root,
                      COLL_TEAM_PARAMS) {
  const Team t = COLL_TEAM;
  __shared__ coll::Block blk;
  coll::begin(t, blk);
  const size_t rank = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t cnt = (size_t)gridDim.x * blockDim.x;
  if (SYMHEAP_COLL_BCAST_PUSH && n > 1) {
    const uint64_t e = blk.epoch;
    const size_t row0 = coll::slot_row(blockIdx.x, n);
    const size_t row1 = coll::slot_row(COLL_MAX_BLOCKS + blockIdx.x, n);
    const uint64_t start = symheap::detail::globaltimer();
    bool ok = true;
    if (me != root) {
      if (threadIdx.x == 0) {
        uint64_t* f = (uint64_t*)(uintptr_t)peer_flags[root] + row0 + me;
        symheap::detail::st_release(f, e);
        ok = coll::wait_ge(flags + row1 + root, e, start, timeout_ns);
      }
      ok = __syncthreads_and(ok) != 0;
    } else {
      for (int j = threadIdx.x; j < n && ok; j += blockDim.x) {
        if (j != me) ok = coll::wait_ge(flags + row0 + j, e, start, timeout_ns);
      }
      ok = __syncthreads_and(ok) != 0;
      if (ok) {
        const int m = dst == src ? n - 1 : n;
        const int rot = (int)(blockIdx.x % (unsigned)m);
        coll::copy_out(src, bytes, coll::MembersDst{dst, &blk, me, n, m, rot}, m,
                       blk.deltas_aligned != 0, rank, cnt);
        // Every thread's stores precede the release below (see the ordering argument).
        __syncthreads();
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
          if (j != me) {
            uint64_t* f = (uint64_t*)(uintptr_t)peer_flags[j] + row1 + me;
            symheap::detail::st_release(f, e);
          }
        }
      }
    }
    if (!ok && threadIdx.x == 0) coll::report(error, SYMHEAP_ERR_COLL_TIMEOUT);
    coll::end(t, blk);
    return;
  }
  if (coll::sync_entry(t, blk)) {
    if (!(me == root && dst == src)) {
      const uint8_t* from = coll::at(blk, src, root);
      coll::copy_out(from, bytes, coll::OneDst{dst}, 1, true, rank, cnt);
    }
    coll::sync_release(t, blk, 1);
  }
  coll::end(t, blk);
}

// ---------------------------------------------------------------------------------------------
// LL exchange for small all_gather (mode 0), alltoall (mode 1) and broadcast (mode 2) on the
// world team, through ar_oneshot's scratch and LL format: sender k's 16-byte vector i for member
// j goes to member j's scratch, parity e & 1, slot j (j's own slot, which the flag path never
// writes), sub-region k, line pair i; the receiver polls its lines and stores the data where the
// collective puts it. One one-way latency, no fence, twice the bytes on the link.
//   all_gather: member k's src (bytes) lands at dst + k * bytes everywhere (my own block by a
//               local copy, skipped in place: src == dst + me * bytes).
//   alltoall:   member k's src + j * bytes lands at member j's dst + k * bytes. Not in place.
//   broadcast:  root's src lands at every member's dst (root's own by a local copy unless
//               dst == src). Only the root sends, so every block also stores its epoch into
//               every member's flag [0][b][me] at entry and waits for all of them before it
//               ends: finishing a launch still implies that every member arrived at it, which the
//               scratch's double buffering relies on (see ar_oneshot). The wait costs nothing
//               in practice: the flags were stored at the others' entry.
// Needs 2 x bytes <= slot_bytes / n (rounded down to 16). Any alignment and size (byte tails).
// ---------------------------------------------------------------------------------------------

namespace coll {

// Bytes [0, len) (len <= 16) at p as a zero-padded vector; whole when `al` and len == 16.
// (Two 64-bit halves, not an array: a runtime-indexed array would live in local memory.)
COLL_DEV v16 load_part(const uint8_t* p, size_t len, bool al) {
  if (al && len == 16) return ld16(p);
  uint64_t lo = 0, hi = 0;
  for (size_t k = 0; k < len; ++k) {
    const uint64_t b = ld_u8(p + k);
    if (k < 8) {
      lo |= b << (8 * k);
    } else {
      hi |= b << (8 * (k - 8));
    }
  }
  return words_to_v16(lo, hi);
}
COLL_DEV void store_part(uint8_t* p, size_t len, bool al, const v16& v) {
  if (al && len == 16) {
    st16(p, v);
    return;
  }
  const uint64_t lo = lo64(v);
  const uint64_t hi = hi64(v);
  for (size_t k = 0; k < len; ++k) {
    st_u8(p + k, (uint8_t)(k < 8 ? lo >> (8 * k) : hi >> (8 * (k - 8))));
  }
}

}  // namespace coll

#define COLL_XCHG_ALL_GATHER 0
#define COLL_XCHG_ALLTOALL 1
#define COLL_XCHG_BROADCAST 2

extern "C" __global__ void __launch_bounds__(1024)
    symheap_exchange_ll(const uint8_t* src, uint8_t* dst, uint64_t bytes, int mode, int root,
                        const uint64_t* peer_scratch, uint64_t* scratch, uint64_t slot_bytes,
                        COLL_TEAM_PARAMS) {
  const Team t = COLL_TEAM;
  __shared__ coll::Block blk;
  coll::begin_epoch(blk, *(volatile const uint64_t*)&ctl[0]);
  const uint64_t e = blk.epoch;
  const uint32_t f = (uint32_t)e | 1u;
  const size_t par = (size_t)(e & 1);
  const bool bcast = mode == COLL_XCHG_BROADCAST;
  const size_t row0 = coll::slot_row(blockIdx.x, n);
  if (bcast && n > 1) {
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      if (j != me) symheap::detail::st_release((uint64_t*)(uintptr_t)peer_flags[j] + row0 + me, e);
    }
  }
  const size_t nvec = (bytes + 15) / 16;
  const size_t vper = (nvec + gridDim.x - 1) / gridDim.x;
  size_t v0 = (size_t)blockIdx.x * vper;
  if (v0 > nvec) v0 = nvec;
  const size_t v1 = v0 + vper < nvec ? v0 + vper : nvec;
  const size_t sub = (size_t)(slot_bytes / n) & ~(size_t)15;
  // Block k of src / dst (alltoall, all_gather positions) stays 16-aligned when bytes is.
  const bool step_al = (bytes & 15) == 0;
  const bool src_al = coll::aligned16(src) && (mode != COLL_XCHG_ALLTOALL || step_al);
  const bool dst_al = coll::aligned16(dst) && (bcast || step_al);
  const size_t my_off = bcast ? 0 : (size_t)me * bytes;  // where my own data lands in my dst
  // Send (and my own part by a local copy).
  if (!bcast || me == root) {
    const uint8_t* own_src = mode == COLL_XCHG_ALLTOALL ? src + (size_t)me * bytes : src;
    const bool own_copy = own_src != dst + my_off;
    for (size_t i = v0 + threadIdx.x; i < v1; i += blockDim.x) {
      const size_t len = bytes - 16 * i < 16 ? bytes - 16 * i : 16;
      coll::v16 v;
      for (int k = 1; k < n; ++k) {
        int j = me + k;
        if (j >= n) j -= n;
        if (k == 1 || mode == COLL_XCHG_ALLTOALL) {
          const uint8_t* from = mode == COLL_XCHG_ALLTOALL ? src + (size_t)j * bytes : src;
          v = coll::load_part(from + 16 * i, len, src_al);
        }
        uint8_t* line = (uint8_t*)(uintptr_t)peer_scratch[j] + (par * n + j) * slot_bytes +
                        (size_t)me * sub + 32 * i;
        coll::st_ll(line, v.x, v.y, f);
        coll::st_ll(line + 16, v.z, v.w, f);
      }
      if (own_copy) {
        coll::store_part(dst + my_off + 16 * i, len, dst_al,
                         coll::load_part(own_src + 16 * i, len, src_al));
      }
    }
  }
  // Receive.
  bool ok = true;
  const uint64_t start = symheap::detail::globaltimer();
  if (!bcast || me != root) {
    const uint8_t* mine = (const uint8_t*)scratch + (par * n + me) * slot_bytes;
    for (size_t i = v0 + threadIdx.x; i < v1 && ok; i += blockDim.x) {
      const size_t len = bytes - 16 * i < 16 ? bytes - 16 * i : 16;
      for (int k = 0; k < n && ok; ++k) {
        if (k == me || (bcast && k != root)) continue;
        coll::v16 v;
        ok = coll::poll_ll(mine + (size_t)k * sub + 32 * i, f, v, start, timeout_ns);
        if (ok) {
          coll::store_part(dst + (bcast ? 0 : (size_t)k * bytes) + 16 * i, len, dst_al, v);
        }
      }
    }
  }
  if (bcast && n > 1) {
    for (int j = threadIdx.x; j < n && ok; j += blockDim.x) {
      if (j != me) ok = coll::wait_ge(flags + row0 + j, e, start, timeout_ns);
    }
  }
  ok = __syncthreads_and(ok) != 0;
  if (!ok && threadIdx.x == 0) coll::report(error, SYMHEAP_ERR_COLL_TIMEOUT);
  coll::end(t, blk);
}

// ---------------------------------------------------------------------------------------------
// LL128 exchange: the same three modes and arguments as symheap_exchange_ll, for larger
// messages, in the LL128 format and region of symheap_ar_ll128 (`ll_off`, `part`: see there).
// Member me's lines for member j go to sub-region (me - j - 1) mod n of j's region; a broadcast
// uses the root's only. Broadcast members also store an arrival flag per block at entry and the
// root waits for them at the end, as in exchange_ll, so that every launch waits for every
// member (the double buffering relies on it). Any alignment and size (byte tails); needs n > 1,
// bytes > 0 and 512 x ceil(bytes / 480) <= the sub-region, else error 4.
// ---------------------------------------------------------------------------------------------

namespace coll {

// Bytes [0, len) (len <= plen, plen 8 or 16) at p as a zero-padded vector: one vector access
// when whole and `al` (p is then plen-aligned).
COLL_DEV v16 load_piece_bytes(const uint8_t* p, size_t len, unsigned plen, bool al) {
  if (al && len == plen && plen == 8) return ld8(p);
  return load_part(p, len, al);
}
COLL_DEV void store_piece_bytes(uint8_t* p, size_t len, unsigned plen, bool al, const v16& v) {
  if (al && len == plen && plen == 8) {
    st8(p, v);
    return;
  }
  store_part(p, len, al, v);
}

}  // namespace coll

extern "C" __global__ void __launch_bounds__(1024)
    symheap_exchange_ll128(const uint8_t* src, uint8_t* dst, uint64_t bytes, int mode, int root,
                           const uint64_t* peer_scratch, uint64_t* scratch, uint64_t ll_off,
                           uint64_t part, COLL_TEAM_PARAMS) {
  const Team t = COLL_TEAM;
  __shared__ coll::Block blk;
  coll::begin_epoch(blk, *(volatile const uint64_t*)&ctl[0]);
  const uint64_t e = blk.epoch;
  const size_t steps = (bytes + COLL_LL128_STEP_DATA - 1) / COLL_LL128_STEP_DATA;
  const size_t sub = n > 1 ? (size_t)(part / (uint64_t)(n - 1)) & ~(size_t)127 : 0;
  bool ok = n > 1 && bytes > 0 && steps * COLL_LL128_STEP_WIRE <= sub && steps < (1u << 30) &&
            ((uintptr_t)scratch & 127) == 0 && (ll_off & 127) == 0 && (part & 127) == 0;
  for (int j = 0; j < n; ++j) ok = ok && ((peer_scratch[j] & 127) == 0);
  if (!ok) {
    if (threadIdx.x == 0) coll::report(error, SYMHEAP_ERR_COLL_LAUNCH);
    coll::end(t, blk);
    return;
  }
  const bool bcast = mode == COLL_XCHG_BROADCAST;
  if (bcast) {
    const size_t row0 = coll::slot_row(blockIdx.x, n);
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      if (j != me) symheap::detail::st_release((uint64_t*)(uintptr_t)peer_flags[j] + row0 + me, e);
    }
  }
  const size_t par_off = ll_off + (size_t)(e & 1) * part;
  const unsigned lane = threadIdx.x & 31;
  const bool flag_lane = (lane & 7) == 7;
  const unsigned poff = coll::ll128_piece_off(lane);
  const unsigned plen = coll::ll128_piece_len(lane);
  // 32-bit step indices (steps * 512 fits the region, checked above): fewer registers.
  const unsigned nsteps = (unsigned)steps;
  const unsigned warps = gridDim.x * (blockDim.x >> 5);
  const unsigned w0 = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  // Block k of src / dst (alltoall, all_gather positions) stays 16-aligned when bytes is.
  const bool step_al = (bytes & 15) == 0;
  const bool src_al = coll::aligned16(src) && (mode != COLL_XCHG_ALLTOALL || step_al);
  const bool dst_al = coll::aligned16(dst) && (bcast || step_al);
  const size_t my_off = bcast ? 0 : (size_t)me * bytes;  // where my own data lands in my dst
  // Bytes of this lane's piece at message offset o (0 past the end).
  auto piece_len = [&](size_t o) -> size_t {
    return o >= bytes ? 0 : (bytes - o < plen ? bytes - o : plen);
  };
  const int U = SYMHEAP_COLL_LL128_UNROLL;
  const size_t gap = (size_t)warps * COLL_LL128_STEP_WIRE;  // between a warp's consecutive steps
  // Send U steps at a time (loads first, then the stores), then my own part by a local copy.
  if (!bcast || me == root) {
    const uint8_t* own_src = mode == COLL_XCHG_ALLTOALL ? src + (size_t)me * bytes : src;
    const bool own_copy = own_src != dst + my_off;
    for (unsigned s0 = w0; s0 < nsteps; s0 += U * warps) {
      const int lines = coll::ll128_batch(s0, nsteps, warps, U);
      coll::v16 v[U];
      for (int k = 1; k < n; ++k) {
        int j = me + k;
        if (j >= n) j -= n;
        if (k == 1 || mode == COLL_XCHG_ALLTOALL) {
          const uint8_t* from = mode == COLL_XCHG_ALLTOALL ? src + (size_t)j * bytes : src;
#pragma unroll
          for (int u = 0; u < U; ++u) {
            const size_t o = (size_t)(s0 + u * warps) * COLL_LL128_STEP_DATA + poff;
            if (u < lines) v[u] = coll::load_piece_bytes(from + o, piece_len(o), plen, src_al);
          }
        }
        uint8_t* line = (uint8_t*)(uintptr_t)(peer_scratch[j] + par_off) +
                        (size_t)(n - 1 - k) * sub + (size_t)s0 * COLL_LL128_STEP_WIRE + 16 * lane;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (u < lines) {
            coll::st_ll128(line + u * gap, coll::lo64(v[u]), flag_lane ? e : coll::hi64(v[u]));
          }
        }
      }
    }
    // My own part, once the peers' stores are on their way.
    for (unsigned s = w0; s < nsteps && own_copy; s += warps) {
      const size_t o = (size_t)s * COLL_LL128_STEP_DATA + poff;
      const size_t len = piece_len(o);
      if (len > 0) {
        coll::store_piece_bytes(dst + my_off + o, len, plen, dst_al,
                                coll::load_piece_bytes(own_src + o, len, plen, src_al));
      }
    }
  }
  // Receive: wait for U steps of a member, then copy them out.
  const uint64_t start = symheap::detail::globaltimer();
  if (!bcast || me != root) {
    const uint8_t* mine = (const uint8_t*)scratch + par_off + 16 * lane;
    for (unsigned s0 = w0; s0 < nsteps && ok; s0 += U * warps) {
      const int lines = coll::ll128_batch(s0, nsteps, warps, U);
      for (int k = 0; k < n && ok; ++k) {
        if (k == me || (bcast && k != root)) continue;
        int r = k - me - 1;
        if (r < 0) r += n;
        const uint8_t* lk = mine + (size_t)r * sub + (size_t)s0 * COLL_LL128_STEP_WIRE;
        ok = coll::wait_ll128<SYMHEAP_COLL_LL128_UNROLL>(lk, gap, lines, e, flag_lane, start,
                                                         timeout_ns);
        if (!ok) break;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const size_t o = (size_t)(s0 + u * warps) * COLL_LL128_STEP_DATA + poff;
          const size_t len = piece_len(o);
          if (u < lines && len > 0) {
            coll::store_piece_bytes(dst + (bcast ? 0 : (size_t)k * bytes) + o, len, plen, dst_al,
                                    coll::ld_line(lk + u * gap));
          }
        }
      }
    }
  }
  if (bcast) {
    // (The row is recomputed rather than kept live through the loops above: registers.)
    const size_t row0 = coll::slot_row(blockIdx.x, n);
    for (int j = threadIdx.x; j < n && ok; j += blockDim.x) {
      if (j != me) ok = coll::wait_ge(flags + row0 + j, e, start, timeout_ns);
    }
  }
  ok = __syncthreads_and(ok) != 0;
  if (!ok && threadIdx.x == 0) coll::report(error, SYMHEAP_ERR_COLL_TIMEOUT);
  coll::end(t, blk);
}

// alltoall: `bytes` per member pair; round 0; src + j * bytes goes to member j's dst + me * bytes
// for every j (self included: a local copy); round 1. Not in place.
#ifndef SYMHEAP_COLL_A2A_OWN
#define SYMHEAP_COLL_A2A_OWN 4
#endif
extern "C" __global__ void __launch_bounds__(1024)
    symheap_alltoall(const uint8_t* src, uint8_t* dst, uint64_t bytes, COLL_TEAM_PARAMS) {
  const Team t = COLL_TEAM;
  __shared__ coll::Block blk;
  coll::begin(t, blk);
  if (coll::sync_entry(t, blk)) {
    uint8_t* mine = dst + (size_t)me * bytes;
    // My own block is a local copy. After the peers' blocks it would add its HBM time to theirs
    // (which the links bound); with a grid of at least 8 n blocks, the first
    // gridDim / (SYMHEAP_COLL_A2A_OWN x n) blocks copy it while the others push to the peers.
    const unsigned own_blocks =
        SYMHEAP_COLL_A2A_OWN > 0 && gridDim.x >= 8u * (unsigned)n
            ? gridDim.x / (SYMHEAP_COLL_A2A_OWN * (unsigned)n)
            : 0;
    const bool own_part = blockIdx.x < own_blocks;
    const unsigned b0 = own_part ? 0 : own_blocks;
    const unsigned nb = own_part ? own_blocks : gridDim.x - own_blocks;
    const size_t rank = (size_t)(blockIdx.x - b0) * blockDim.x + threadIdx.x;
    const size_t cnt = (size_t)nb * blockDim.x;
    for (int k = 1; k <= n; ++k) {
      const int j = (me + k) % n;  // peers first, my own block last
      if (own_blocks > 0 && own_part != (j == me)) continue;
      coll::copy_out(src + (size_t)j * bytes, bytes, coll::OneDst{coll::at(blk, mine, j)}, 1,
                     blk.deltas_aligned != 0, rank, cnt);
    }
    coll::sync_release(t, blk, 1);
  }
  coll::end(t, blk);
}
