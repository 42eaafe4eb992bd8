// provider_mix.cu — one kernel over memory from any provider.
//
// The kernel knows nothing about who allocated its buffers: it gets a pointer into this PE's copy
// and a peer table (`int64_t[n_pes]`, `bases[me] == this PE's copy`, 0 for PEs that are not
// directly addressable), and translates with symheap::translate. So the same code runs over
// symheap's own heap, NVSHMEM (`nvshmem_malloc` + `nvshmem_ptr`) or torch SymmetricMemory, and
// one launch may mix buffers of different providers, each with its own table.
//
// Every PE writes its slot (`words` uint32 at x + me*words, and the same in y) into every direct
// PE's copy of x (translated with table tx) and of y (with ty). A table may belong to ANOTHER
// allocation of the same provider: that works when the provider keeps the per-peer offset
// `bases[r] - bases[me]` the same for all its allocations (symheap's heap and NVSHMEM do).
//
// Launch: any grid and block; x_slot / y_slot = this PE's copy + me*words; barrier on every PE
// before the launch (peers must be allowed to write) and after it (before reading).
#include "symheap.cuh"

// The value PE `from` writes at word i of its slot in PE `to`'s copy of buffer `tag`.
__device__ __forceinline__ uint32_t mix_value(uint64_t seed, int tag, int from, int to, int i) {
  uint64_t x = seed ^ ((uint64_t)tag << 56) ^ ((uint64_t)from << 40) ^ ((uint64_t)to << 24) ^
               (uint64_t)i;
  x = (x ^ (x >> 31)) * 0x7fb5d329728ea185ull;
  x = (x ^ (x >> 27)) * 0x81dadef4bc2dd44dull;
  return (uint32_t)(x ^ (x >> 33));
}

extern "C" __global__ void provider_mix(const int64_t* tx, uint32_t* x_slot, const int64_t* ty,
                                        uint32_t* y_slot, int me, int npes, int words,
                                        uint64_t seed) {
  for (int j = 0; j < npes; ++j) {
    uint32_t* rx = symheap::translate(x_slot, me, j, tx);
    uint32_t* ry = symheap::translate(y_slot, me, j, ty);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x) {
      if (rx != nullptr) rx[i] = mix_value(seed, 0, me, j, i);
      if (ry != nullptr) ry[i] = mix_value(seed, 1, me, j, i);
    }
  }
}
