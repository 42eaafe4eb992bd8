// nvshmem_ring.cu — one kernel that reaches every peer: symheap's stores where the peer table
// has an address (same node: NVLink, PCIe P2P, the same GPU), NVSHMEM's device library where it
// has 0 (another node, reached over NVSHMEM's network transport).
//
// Every PE puts its `n` int64 values from `src` into the NEXT PE's `dst` and sets the next PE's
// signal word `sig` to `round`; then it waits for its own signal (the previous PE's data has
// landed) and reports what it saw in `status`.
//
// Memory: `dst`, `src` and `sig` come from symheap's NVSHMEM provider
// (`symheap.providers.nvshmem().allocate_symmetric`), so NVSHMEM can move them to any PE;
// `bases` is their peer table (one table serves all three: the provider's per-peer offsets are
// the same for every allocation).
//
// Build (on a machine with nvcc; `NvshmemProvider.device_library()` gives INC and LIB):
//   nvcc -arch=sm_90 -rdc=true -I$INC -I<symheap include dir> -c nvshmem_ring.cu -o ring.o
//   nvcc -arch=sm_90 -dlink -cubin ring.o $LIB/libnvshmem_device.a -o ring.cubin
// Load `ring.cubin` (cuModuleLoadData; CuPy: cupy.cuda.function.Module().load(bytes)) and call
// `NvshmemProvider.init_module(module_handle)` before the first launch: NVSHMEM's device
// functions read state that lives in each module, and it is uninitialised until then.
//
// Launch: 1 block of any size on every PE, `round` 1, 2, ... (a barrier between rounds);
// `force_nvshmem` 1 takes NVSHMEM's path for every peer (it works for direct peers too; the
// tests use it to run the device library on one node).
//
// status[0]: the PE NVSHMEM's device state names (nvshmem_my_pe(): the module is set up);
// status[1]: 1 if the previous PE's signal came within timeout_ns, else 0;
// status[2]: 1 if this PE took NVSHMEM's path to the next PE, 0 for symheap's stores.
#include <nvshmem.h>
#include <nvshmemx.h>

#include "symheap.cuh"

extern "C" __global__ void nvshmem_ring(int64_t* dst, const int64_t* src, uint64_t n,
                                        uint64_t* sig, const int64_t* bases, uint64_t round,
                                        int force_nvshmem, uint64_t timeout_ns,
                                        uint32_t* status) {
  if (blockIdx.x != 0) return;
  const int me = nvshmem_my_pe();
  const int next = (me + 1) % nvshmem_n_pes();
  const bool direct = !force_nvshmem && symheap::is_direct(next, bases);
  if (direct) {
    // put_block ends with __syncthreads: every thread's stores precede the release below.
    symheap::put_block(dst, src, n, me, next, bases);
    if (threadIdx.x == 0) symheap::signal_set(sig, round, me, next, bases);
  } else {
    // The whole block calls it; NVSHMEM delivers the signal after the data.
    nvshmemx_putmem_signal_block(dst, src, n * sizeof(int64_t), sig, round, NVSHMEM_SIGNAL_SET,
                                 next);
  }
  if (threadIdx.x == 0) {
    status[0] = (uint32_t)me;
    status[1] = symheap::signal_wait_until(sig, SYMHEAP_CMP_GE, round, timeout_ns) ? 1u : 0u;
    status[2] = direct ? 0u : 1u;
  }
}
