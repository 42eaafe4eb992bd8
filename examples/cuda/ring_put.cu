// ring_put.cu — a ring exchange written against symheap.cuh.
//
// Every PE fills a tile of `n` floats, puts it into the NEXT PE's copy of the symmetric buffer
// `recv` with put_block, then signal_adds the next PE's symmetric signal word. It then waits for
// its own signal (the previous PE's tile has landed), checks the tile it received, and writes the
// number of wrong elements to *mismatches (0xffffffff if the signal never came).
//
// How it is launched (the Rust/Python side loads this file with NVRTC, passing symheap.cuh as an
// in-memory header named "symheap.cuh", compiles it for the device's sm_XX to CUBIN, and launches
// `ring_put` through the driver API):
//   * on every PE, once per round, grid = 1 block, block = any size (256 is good);
//   * recv: symmetric allocation of >= n floats; recv_bases its peer table;
//   * sig: symmetric uint64_t word, zeroed and followed by a barrier before the first round;
//     sig_bases its peer table (for symheap's own heap one table serves both buffers);
//   * send: local device memory of >= n floats (scratch; this kernel fills it);
//   * round: 1 for the first launch, +1 per launch (the signal counts arrivals: GE round);
//     between rounds every PE must have finished reading recv: put a barrier between launches;
//   * timeout_ns: how long to wait for the previous PE (e.g. from SYMHEAP_TIMEOUT);
//   * mismatches: a uint32_t the host reads afterwards (device or mapped host memory).
#include "symheap.cuh"

// The value PE `pe` sends at index i in round `round`: an integer below 2^24, exact in a float.
__device__ __forceinline__ float ring_pattern(int pe, uint64_t i, uint64_t round) {
  return (float)((unsigned)((uint64_t)pe * 7919u + i * 31u + round * 1000003u) & 0xffffffu);
}

extern "C" __global__ void ring_put(float* recv, float* send, uint64_t n, uint64_t* sig,
                                    const int64_t* recv_bases, const int64_t* sig_bases, int me,
                                    int npes, uint64_t round, uint64_t timeout_ns,
                                    uint32_t* mismatches) {
  if (blockIdx.x != 0) return;
  const int next = (me + 1) % npes;
  const int prev = (me + npes - 1) % npes;

  // 1. This PE's tile.
  for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) send[i] = ring_pattern(me, i, round);
  __syncthreads();

  // 2. Into the next PE's recv (the whole block cooperates; put_block ends with __syncthreads, so
  //    every thread's stores precede thread 0's release below).
  symheap::put_block(recv, send, n, me, next, recv_bases);
  if (threadIdx.x == 0) symheap::signal_add(sig, 1, me, next, sig_bases);

  // 3. Wait for the previous PE's tile: its signal_add (release) pairs with this acquire.
  __shared__ int arrived;
  __shared__ unsigned int wrong;
  if (threadIdx.x == 0) {
    arrived = symheap::signal_wait_until(sig, SYMHEAP_CMP_GE, round, timeout_ns) ? 1 : 0;
    wrong = 0;
  }
  __syncthreads();
  if (!arrived) {
    if (threadIdx.x == 0) *mismatches = 0xffffffffu;
    return;
  }

  // 4. Check it.
  unsigned int mine = 0;
  for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if (recv[i] != ring_pattern(prev, i, round)) ++mine;
  }
  if (mine) atomicAdd(&wrong, mine);
  __syncthreads();
  if (threadIdx.x == 0) *mismatches = wrong;
}
