// symheap's own kernels for the CUDA backend. Compiled at run time by NVRTC (see nvrtc.rs) with
// symheap.cuh passed as an in-memory header; no CUDA toolkit header is included.
//
// The Rust launcher depends on these exact names (extern "C", no mangling). Every kernel takes
// one parameter, its argument block (a struct below, by value), mirrored by a #[repr(C)] struct
// in kernel_args.rs; the Rust side prepends SYMHEAP_ARG_LAYOUT (static_asserts of its layout,
// see arg_block.rs), expanded after the structs, so the two cannot drift apart.
// Kernels never printf; failures are reported through host-visible error words.

// The context's abort word (host-mapped, 0 while the job is healthy), set by the host when it
// loads this module. Long waits poll it (SYMHEAP_GIVE_UP), so when any PE fails (exits, aborts,
// diverges) every wait ends within microseconds instead of at its timeout, and the host reports
// the failure.
__device__ const volatile unsigned int* symheap_abort_word;
#define SYMHEAP_GIVE_UP() (symheap_abort_word != nullptr && *symheap_abort_word != 0u)
#include "symheap.cuh"

namespace kern {
struct CopyArgs {
  uint8_t* dst;
  const uint8_t* src;
  uint64_t bytes;
};
struct SignalArgs {
  uint64_t* sig;
  uint64_t value;
  int32_t op;
  int32_t reserved;
};
struct PutSignalArgs {
  uint8_t* dst;
  const uint8_t* src;
  uint64_t bytes;
  uint64_t* sig;
  uint64_t value;
  int32_t op;
  int32_t reserved;
};
struct WaitArgs {
  const uint64_t* sig;
  uint64_t value;
  uint64_t timeout_ns;
  uint32_t* error;
  int32_t cmp;
  int32_t reserved;
};
struct BarrierArgs {
  uint64_t* flags;
  const uint64_t* peer_flags;
  uint64_t* epoch_ptr;
  uint64_t timeout_ns;
  uint32_t* error;
  int32_t me;
  int32_t n;
};
struct AtomicArgs {
  uint64_t* addr;
  uint64_t operand;
  uint64_t compare;
  uint64_t* old_out;
  int32_t op;
  int32_t width;
};
}  // namespace kern

#ifndef SYMHEAP_ARG_LAYOUT
#error "compile kernels.cu through kernels_source() (kernels.rs): it prepends the Rust layout checks"
#endif
SYMHEAP_ARG_LAYOUT

// Error codes written to the `error` word.
#define SYMHEAP_ERR_WAIT_TIMEOUT 1u
#define SYMHEAP_ERR_BARRIER_TIMEOUT 2u

// Atomic store (st.relaxed.sys) of an error code into a host-visible word. A store rather than an
// atomic read-modify-write: the word may be mapped host memory, where PCIe systems do not promise
// device atomics.
__device__ __forceinline__ void symheap_report(uint32_t* error, uint32_t code) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(error), "r"(code) : "memory");
}

// Copies `bytes` bytes from src to dst (either may be a peer's memory): grid-stride, 16-byte
// vector loads/stores when dst and src are congruent modulo 16 (a byte head/tail otherwise), four
// independent 16-byte loads in flight per thread. Any grid size is correct; NVLink bandwidth needs
// enough blocks (a few per SM).
extern "C" __global__ void symheap_copy(const kern::CopyArgs a) {
  const size_t rank = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t count = (size_t)gridDim.x * blockDim.x;
  symheap::detail::copy_bytes_inline(a.dst, a.src, (size_t)a.bytes, rank, count);
}

// One thread: makes every earlier store of this stream system visible, then publishes the signal.
// op 0: *sig = value (st.release.sys); op 1: *sig += value (red.release.sys). Other ops: nothing.
extern "C" __global__ void symheap_signal(const kern::SignalArgs a) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  symheap::quiet();
  if (a.op == 0) {
    symheap::detail::st_release(a.sig, a.value);
  } else if (a.op == 1) {
    symheap::detail::red_add_release(a.sig, a.value);
  }
}

// One block: copies `bytes` from src to dst (dst a peer's memory), then thread 0 updates the
// signal with a release at system scope (op 0 set, 1 add). A small put with signal is one launch
// instead of two (copy, then symheap_signal): the second launch cost more than the copy. The
// block barrier makes every thread's stores precede thread 0's release, which is cumulative, so
// an acquire that sees the signal sees the data (symheap.cuh's put_block + signal pattern).
extern "C" __global__ void symheap_put_signal(const kern::PutSignalArgs a) {
  if (blockIdx.x != 0) return;
  symheap::detail::copy_bytes_inline(a.dst, a.src, (size_t)a.bytes, threadIdx.x, blockDim.x);
  __syncthreads();
  if (threadIdx.x != 0) return;
  if (a.op == 0) {
    symheap::detail::st_release(a.sig, a.value);
  } else if (a.op == 1) {
    symheap::detail::red_add_release(a.sig, a.value);
  }
}

// One thread: waits until *sig compares `cmp` (SYMHEAP_CMP_*) to `value`; on timeout stores 1 to
// the host-visible *error and returns. timeout_ns == 0 tests once; ~0 waits without bound.
extern "C" __global__ void symheap_wait(const kern::WaitArgs a) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  if (!symheap::signal_wait_until(a.sig, a.cmp, a.value, a.timeout_ns)) {
    symheap_report(a.error, SYMHEAP_ERR_WAIT_TIMEOUT);
  }
}

// One block (ideally >= n threads; fewer works, each thread then handles several members):
// barrier among the n team members. flags: my array, one word per team index; peer_flags[j]: the
// address, in this process, of member j's array; epoch_ptr: this PE's barrier counter in device
// memory (the number of barriers completed on this flags array, 0 at first). The kernel uses
// epoch = *epoch_ptr + 1 and stores it back, so a captured CUDA graph replays correctly (an epoch
// passed by value would be frozen into the graph). Every member's counter advances in lockstep
// because barriers are collective. me: my team index. On timeout stores 2 to the host-visible
// *error (the counter still advances, keeping the members' epochs aligned).
extern "C" __global__ void symheap_barrier(const kern::BarrierArgs a) {
  if (blockIdx.x != 0) return;
  const uint64_t epoch = *a.epoch_ptr + 1;
  // barrier_block_peers starts with __syncthreads: every thread has read the old counter before
  // thread 0 writes the new one below.
  const bool ok =
      symheap::barrier_block_peers(a.flags, a.peer_flags, a.me, a.n, epoch, a.timeout_ns);
  if (threadIdx.x == 0) {
    *a.epoch_ptr = epoch;
    if (!ok) {
      symheap_report(a.error, SYMHEAP_ERR_BARRIER_TIMEOUT);
      // The members are out of step now: every later wait of this PE gives up at once.
      if (symheap_abort_word != nullptr) {
        symheap_report((uint32_t*)symheap_abort_word, 1u);
      }
    }
  }
  __syncthreads();
  symheap::quiet();
}

// One thread: an atomic on a 4- or 8-byte word (width) at system scope. op: 0 load, 1 store,
// 2 swap, 3 compare-swap (write operand if the word equals compare), 4 add, 5 and, 6 or, 7 xor.
// Writes the word's previous value, zero-extended, to *old_out (0 for an unknown op or width).
extern "C" __global__ void symheap_atomic(const kern::AtomicArgs a) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  namespace d = symheap::detail;
  uint64_t* const addr = a.addr;
  const int op = a.op;
  const int width = a.width;
  const uint64_t operand = a.operand;
  const uint64_t compare = a.compare;
  uint64_t old = 0;
  if (width == 4) {
    unsigned int* p = (unsigned int*)addr;
    const unsigned int v = (unsigned int)operand;
    switch (op) {
      case 0: old = d::ld_relaxed(p); break;
      case 1:
      case 2: old = d::xchg(p, v); break;
      case 3: old = d::cas(p, (unsigned int)compare, v); break;
      case 4: old = d::fetch_add(p, v); break;
      case 5: old = d::fetch_and(p, v); break;
      case 6: old = d::fetch_or(p, v); break;
      case 7: old = d::fetch_xor(p, v); break;
      default: break;
    }
  } else if (width == 8) {
    unsigned long long* p = (unsigned long long*)addr;
    const unsigned long long v = operand;
    switch (op) {
      case 0: old = d::ld_relaxed(p); break;
      case 1:
      case 2: old = d::xchg(p, v); break;
      case 3: old = d::cas(p, (unsigned long long)compare, v); break;
      case 4: old = d::fetch_add(p, v); break;
      case 5: old = d::fetch_and(p, v); break;
      case 6: old = d::fetch_or(p, v); break;
      case 7: old = d::fetch_xor(p, v); break;
      default: break;
    }
  }
  *a.old_out = old;
}
