// symheap's collective kernels, part 3 of 3: the exchange family (all_gather, broadcast,
// alltoall, and the LL / LL128 exchange kernels for small and mid-size messages). Compiled as one
// program with parts 1 and 2 (nvrtc.rs, `COLL`); the line formats are in part 2.

// all_gather: round 0; my `bytes` from src go to dst + me * bytes of every member (self too,
// unless src == dst + me * bytes); round 1.
// Reads src, dst, count (bytes).
extern "C" __global__ void __launch_bounds__(1024) symheap_allgather(const coll::Args a) {
  const Team t = a.team;
  COLL_TEAM_NAMES(t);
  const uint8_t* const src = (const uint8_t*)a.src;
  uint8_t* const dst = (uint8_t*)a.dst;
  const uint64_t bytes = a.count;
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
// Reads src, dst, count (bytes), root.
extern "C" __global__ void __launch_bounds__(1024) symheap_broadcast(const coll::Args a) {
  const Team t = a.team;
  COLL_TEAM_NAMES(t);
  const uint8_t* const src = (const uint8_t*)a.src;
  uint8_t* const dst = (uint8_t*)a.dst;
  const uint64_t bytes = a.count;
  const int root = a.root;
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

// Reads src, dst, count (bytes per member), mode, root, peer_scratch, scratch, slot_bytes.
extern "C" __global__ void __launch_bounds__(1024) symheap_exchange_ll(const coll::Args a) {
  const Team t = a.team;
  COLL_TEAM_NAMES(t);
  const uint8_t* const src = (const uint8_t*)a.src;
  uint8_t* const dst = (uint8_t*)a.dst;
  const uint64_t bytes = a.count;
  const int mode = a.mode;
  const int root = a.root;
  const uint64_t* const peer_scratch = a.peer_scratch;
  uint64_t* const scratch = a.scratch;
  const uint64_t slot_bytes = a.slot_bytes;
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

// Reads src, dst, count (bytes per member), mode, root, peer_scratch, scratch, ll_off, part.
extern "C" __global__ void __launch_bounds__(1024) symheap_exchange_ll128(const coll::Args a) {
  const Team t = a.team;
  COLL_TEAM_NAMES(t);
  const uint8_t* const src = (const uint8_t*)a.src;
  uint8_t* const dst = (uint8_t*)a.dst;
  const uint64_t bytes = a.count;
  const int mode = a.mode;
  const int root = a.root;
  const uint64_t* const peer_scratch = a.peer_scratch;
  uint64_t* const scratch = a.scratch;
  const uint64_t ll_off = a.ll_off;
  const uint64_t part = a.part;
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
// Reads src, dst, count (bytes per pair).
extern "C" __global__ void __launch_bounds__(1024) symheap_alltoall(const coll::Args a) {
  const Team t = a.team;
  COLL_TEAM_NAMES(t);
  const uint8_t* const src = (const uint8_t*)a.src;
  uint8_t* const dst = (uint8_t*)a.dst;
  const uint64_t bytes = a.count;
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

// A barrier of the team on the stream, and nothing else: every member's earlier stream work
// (its source written, its earlier copies done) is complete before any member's later work
// runs. One block. The uneven alltoall with split sizes on the host puts its copy-engine pulls
// between two of them.
extern "C" __global__ void __launch_bounds__(1024) symheap_team_barrier(const coll::Args a) {
  const Team t = a.team;
  __shared__ coll::Block blk;
  coll::begin(t, blk);
  coll::sync_release(t, blk, 0);
  coll::end(t, blk);
}

// An int64 count of member memory (L2, never a stale L1 line).
COLL_DEV int64_t ld_count(const int64_t* p) {
  int64_t v;
  asm volatile("ld.global.cg.s64 %0, [%1];" : "=l"(v) : "l"(p));
  return v;
}

// all_to_all_vdev: the counts are in device memory. Member j's `splits` (n int64, symmetric)
// holds the rows it sends each member, its blocks packed in member order in its `src`;
// `row` bytes per row; every member's source holds `src_rows` rows and destination `dst_rows`.
// Round 0; every block reads every member's counts (the same matrix on every member, hence
// the same verdict): a negative count, a member sending more than `src_rows` rows or receiving
// more than `dst_rows` moves nothing and reports error 4 (without the abort word: the members
// stay in step and the context usable). Otherwise block 0 writes `out` (2 x n int64: rows from
// member j, then where they start in `dst`, in rows, member order) and every member pulls its
// blocks from the members' sources; round 1 (every member done reading the sources and
// counts). Not in place.
extern "C" __global__ void __launch_bounds__(1024) symheap_alltoallv(const coll::Args a) {
  const Team t = a.team;
  COLL_TEAM_NAMES(t);
  const uint8_t* const src = (const uint8_t*)a.src;
  uint8_t* const dst = (uint8_t*)a.dst;
  const int64_t* const splits = a.splits;
  int64_t* const out = a.out;
  const uint64_t row = a.count, src_rows = a.src_rows, dst_rows = a.dst_rows;
  __shared__ coll::Block blk;
  __shared__ uint64_t from[COLL_MAX_TEAM];            // my block's first row in member j's src
  __shared__ uint64_t cnt[COLL_MAX_TEAM];             // rows member j sends me
  __shared__ uint64_t land[COLL_MAX_TEAM];            // where they start in my dst (rows)
  __shared__ int bad;
  coll::begin(t, blk);
  if (coll::sync_entry(t, blk)) {
    if (threadIdx.x == 0) bad = 0;
    __syncthreads();
    // Thread j reads member j's counts (its row): its total and the rows before my block.
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      const int64_t* sj = coll::at(blk, splits, j);
      uint64_t total = 0, before = 0;
      int wrong = 0;
      for (int k = 0; k < n; ++k) {
        const int64_t c = ld_count(sj + k);
        if (c < 0 || (uint64_t)c > src_rows) {
          wrong = 1;
          continue;
        }
        if (k < me) before += (uint64_t)c;
        if (k == me) cnt[j] = (uint64_t)c;
        total += (uint64_t)c;
      }
      if (wrong || total > src_rows) bad = 1;
      from[j] = before;
    }
    // Thread k sums column k (the rows member k receives) itself: no atomics in the kernel
    // but the exit counter. A negative count was already flagged above.
    for (int k = threadIdx.x; k < n; k += blockDim.x) {
      uint64_t col = 0;
      for (int j = 0; j < n; ++j) {
        const int64_t c = ld_count(coll::at(blk, splits, j) + k);
        col += c > 0 ? (uint64_t)c : 0;
      }
      if (col > dst_rows) bad = 1;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint64_t at = 0;
      for (int j = 0; j < n; ++j) {
        land[j] = at;
        at += bad ? 0 : cnt[j];
      }
    }
    __syncthreads();
    if (bad) {
      if (blockIdx.x == 0 && threadIdx.x == 0) {
        asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(error), "r"(4u) : "memory");
      }
    } else {
      if (blockIdx.x == 0 && out != nullptr) {
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
          out[j] = (int64_t)cnt[j];
          out[n + j] = (int64_t)land[j];
        }
      }
      const size_t rank = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
      const size_t total = (size_t)gridDim.x * blockDim.x;
      for (int k = 1; k <= n; ++k) {
        const int j = (me + k) % n;  // peers first, my own block last
        const uint8_t* theirs = coll::at(blk, src, j) + from[j] * row;
        coll::copy_out(theirs, cnt[j] * row, coll::OneDst{dst + land[j] * row}, 1, true, rank,
                       total);
      }
    }
    coll::sync_release(t, blk, 1);
  }
  coll::end(t, blk);
}
