// symheap's collective kernels for the CUDA backend (all_reduce one-shot / two-shot, all_gather,
// reduce_scatter, broadcast, alltoall), part 1 of 3: the launch contract, the memory and element
// helpers, the team barrier and the reduction and copy loops every kernel uses. Parts 2
// (all_reduce.cu) and 3 (exchange.cu) follow it in one program ("coll.cu"): nvrtc.rs, `COLL`,
// concatenates the three, and NVRTC compiles that at build or run time with symheap.cuh passed
// as an in-memory header; no CUDA toolkit header.
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
// * One parameter: the argument block coll::Args (below), by value, mirrored by CollArgs in
//   coll_args.rs; the Rust side prepends SYMHEAP_ARG_LAYOUT (static_asserts of its layout, see
//   arg_block.rs), expanded after the structs, so a field that differs fails the compile. Each
//   kernel reads the fields of its family (the kernels' comments); its team part, coll::Team:
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
  int32_t me;
  int32_t n;
  uint64_t timeout_ns;
  uint32_t* error;
};

// The one parameter of every collective kernel (see the launch contract above).
struct Args {
  const void* src;
  void* dst;
  uint64_t count;                // elements (reducing kernels) or bytes per member (the others)
  uint64_t stride;               // one-shot: element stride between the members' src blocks
  const uint64_t* peer_scratch;  // scratch kernels: device array [n] of the scratch bases
  uint64_t* scratch;             // scratch kernels: my scratch
  uint64_t slot_bytes;           // LL and flag kernels: the scratch slot size
  uint64_t ll_off;               // LL128 kernels: the LL128 region's offset in every scratch
  uint64_t part;                 // LL128 kernels: the region's bytes per parity
  const int64_t* splits;         // alltoallv: every member's send counts (int64 [n], symmetric)
  int64_t* out;                  // alltoallv: rows received and their offsets (int64 [2 n]) or 0
  uint64_t src_rows;             // alltoallv: rows every member's source holds
  uint64_t dst_rows;             // alltoallv: rows every member's destination holds
  int32_t op;                    // reducing kernels: 0 sum, 1 min, 2 max, 3 prod
  int32_t mode;                  // exchange kernels: COLL_XCHG_*
  int32_t root;                  // broadcast and exchange kernels: the root's team index
  int32_t reserved;
  Team team;
};

#ifndef SYMHEAP_ARG_LAYOUT
#error "compile coll.cu through coll_source() (kernels.rs): it prepends the Rust layout checks"
#endif
SYMHEAP_ARG_LAYOUT

// The team's fields under the names the kernel bodies use (not every kernel uses each).
#define COLL_TEAM_NAMES(T)                                            \
  [[maybe_unused]] const int me = (T).me;                             \
  [[maybe_unused]] const int n = (T).n;                               \
  [[maybe_unused]] uint64_t* const flags = (T).flags;                 \
  [[maybe_unused]] const uint64_t* const peer_flags = (T).peer_flags; \
  [[maybe_unused]] uint64_t* const ctl = (T).ctl;                     \
  [[maybe_unused]] const uint64_t timeout_ns = (T).timeout_ns;        \
  [[maybe_unused]] uint32_t* const error = (T).error

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

}  // namespace coll
