// symheap's collective kernels, part 2 of 3: the all_reduce family (one-shot LL, flag and LL128,
// two-shot) and reduce_scatter, with the LL and LL128 line formats the exchange kernels (part 3)
// use too. Compiled as one program with parts 1 and 3 (nvrtc.rs, `COLL`, concatenates them in
// order); the launch contract and the ordering argument are at the top of part 1 (common.cu).

namespace coll {

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
// base. count * sizeof(T) <= slot_bytes. Reads src, dst, count, stride, op, peer_scratch,
// scratch, slot_bytes.
#define COLL_ONESHOT(SUFFIX, D, S)                                                      \
  extern "C" __global__ void __launch_bounds__(1024)                                    \
      symheap_ar_oneshot_##SUFFIX(const coll::Args a) {                                 \
    coll::ar_oneshot<D>((const S*)a.src, (S*)a.dst, a.count, a.stride, a.op,            \
                        a.peer_scratch, a.scratch, a.slot_bytes, coll::Team(a.team));   \
  }

// The one-shot's flag path (the launcher's choice above the LL sizes): the same fields.
#define COLL_FLAG(SUFFIX, D, S)                                                                  \
  extern "C" __global__ void __launch_bounds__(1024) symheap_ar_flag_##SUFFIX(const coll::Args a) { \
    coll::ar_flag<D>((const S*)a.src, (S*)a.dst, a.count, a.stride, a.op, a.peer_scratch,        \
                     a.scratch, a.slot_bytes, coll::Team(a.team));                               \
  }

// The one-shot's LL128 path (mid-size messages): scratch is my scratch base, the LL128 region
// starts ll_off bytes into every member's scratch, `part` bytes per parity. Reads src, dst,
// count, stride, op, peer_scratch, scratch, ll_off, part.
#define COLL_LL128(SUFFIX, D, S)                                                        \
  extern "C" __global__ void __launch_bounds__(1024)                                    \
      symheap_ar_ll128_##SUFFIX(const coll::Args a) {                                   \
    coll::ar_ll128<D>((const S*)a.src, (S*)a.dst, a.count, a.stride, a.op, a.peer_scratch, \
                      a.scratch, a.ll_off, a.part, coll::Team(a.team));                 \
  }

// Two-shot all_reduce (bandwidth path), no scratch. Reads src, dst, count, op.
#define COLL_TWOSHOT(SUFFIX, D, S)                                                      \
  extern "C" __global__ void __launch_bounds__(1024)                                    \
      symheap_ar_twoshot_##SUFFIX(const coll::Args a) {                                 \
    coll::ar_twoshot<D>((const S*)a.src, (S*)a.dst, a.count, a.op, coll::Team(a.team)); \
  }

// reduce_scatter: src holds n * count elements; dst[i] = reduce_j member j's src[me * count + i].
// Reads src, dst, count, op.
#define COLL_REDUCE_SCATTER(SUFFIX, D, S)                                                   \
  extern "C" __global__ void __launch_bounds__(1024)                                        \
      symheap_reduce_scatter_##SUFFIX(const coll::Args a) {                                 \
    coll::reduce_scatter<D>((const S*)a.src, (S*)a.dst, a.count, a.op, coll::Team(a.team)); \
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

