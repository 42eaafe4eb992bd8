"""FlashInfer's custom all_reduce as a peer of `symheap bench`: the TensorRT-LLM kernels of
`flashinfer.comm` (flashinfer-python 0.7.x), one-shot and two-shot, plain all_reduce pattern
(`AllReduceFusionPattern.kAllReduce`), bf16, eager and CUDA graph, on the all_reduce sizes of
symheap's GPU sweep up to FI_MAX_BYTES (default 32 MiB: the IPC workspace grows as
ranks^2 x the largest message).

Set-up: `trtllm_create_ipc_workspace_for_all_reduce_fusion(rank, world, max_tokens, hidden,
group=WORLD, create_metadata=True)` (the IPC workspace, allocated through torch SymmetricMemory),
then `trtllm_allreduce_fusion(allreduce_in=[tokens, hidden], ..., use_oneshot=True/False,
allreduce_out=...)`; a message of B bytes is B / (2 x hidden) tokens of hidden = 4096. Two-shot
needs more tokens than ranks; sizes where FlashInfer refuses a variant are printed with the
reason. The kernels are compiled by FlashInfer's JIT on first use (nvcc on the GPU machine).
Rows are named `FlashInfer <version> trtllm one-shot|two-shot`.

Launch: torchrun --standalone --nproc-per-node N bench/flashinfer_peer.py OUT.json [--sizes ...]"""

import os
import sys

import peer_common as pc
import torch
import torch.distributed as dist

HIDDEN = 4096


def main():
    out, _, sizes, extra = pc.parse(sys.argv[1:], __doc__)
    cap = int(extra.get("max-bytes", os.environ.get("FI_MAX_BYTES", str(32 << 20))))
    sizes = [b for b in sizes if b <= cap and b % (2 * HIDDEN) == 0]
    # The workspace is exchanged through torch SymmetricMemory over a process group, even of one
    # rank (torch's own NCCL, as bench/torch_symm_mem.py).
    boot = pc.Boot("nccl", always=True)
    try:
        import flashinfer
        import flashinfer.comm as fc
    except Exception as e:  # noqa: BLE001 - say why there is no FlashInfer column
        boot.say(f"flashinfer_peer: FlashInfer not available: {type(e).__name__}: {e}"[:600])
        sys.exit(1)
    name = f"FlashInfer {flashinfer.__version__} trtllm"
    boot.say(f"flashinfer_peer: {name}, {boot.world} rank(s), sizes up to {cap} B")
    max_tokens = max(sizes) // (2 * HIDDEN)
    try:
        handles, workspace, meta = fc.trtllm_create_ipc_workspace_for_all_reduce_fusion(
            boot.rank, boot.world, max_tokens, HIDDEN, group=dist.group.WORLD, create_metadata=True
        )
    except Exception as e:  # noqa: BLE001 - e.g. a world size the kernels do not take
        boot.say(f"flashinfer_peer: no IPC workspace at {boot.world} rank(s): {type(e).__name__}: {e}"[:600])
        sys.exit(1)
    dev = torch.device("cuda", boot.local)
    rows = []
    for nbytes in sizes:
        tokens = nbytes // (2 * HIDDEN)
        x = pc.bf16(nbytes // 2, dev, 3).view(tokens, HIDDEN)
        y = torch.empty_like(x)
        for variant, oneshot in (("one-shot", True), ("two-shot", False)):

            def f(x=x, y=y, tokens=tokens, oneshot=oneshot):
                fc.trtllm_allreduce_fusion(
                    allreduce_in=x,
                    world_size=boot.world,
                    world_rank=boot.rank,
                    token_num=tokens,
                    hidden_dim=HIDDEN,
                    workspace_ptrs=workspace,
                    launch_with_pdl=False,
                    trigger_completion_at_end=True,
                    fp32_acc=False,
                    pattern_code=fc.AllReduceFusionPattern.kAllReduce,
                    use_oneshot=oneshot,
                    allreduce_out=y,
                    residual_in=None,
                    residual_out=None,
                    norm_out=None,
                    quant_out=None,
                    scale_out=None,
                    rms_gamma=None,
                    rms_eps=None,
                    scale_factor=None,
                    layout_code=None,
                    metadata=meta,
                )

            pc.measure(boot, rows, "all_reduce", nbytes, f"{name} {variant}", f)
        del x, y
    pc.write_rows(boot, out, rows, "flashinfer_peer")
    torch.cuda.synchronize()
    fc.trtllm_destroy_ipc_workspace_for_all_reduce_fusion(handles, dist.group.WORLD)
    boot.close()


if __name__ == "__main__":
    main()
