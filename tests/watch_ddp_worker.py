"""Two gloo processes training the Annotated Transformer under DistributedDataParallel (or FSDP's
fully_shard), with or without attnscope.watch; each rank writes its final weights
(tests/test_watch_integrations.py compares them).

    python tests/watch_ddp_worker.py OUT_DIR RUN_DIR|- PORT ddp|fsdp
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.usermodels import annotated as A  # noqa: E402


def worker(rank: int, world: int, out: str, run_dir: str, port: str, mode: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = A.make_model(dropout=0.1)
    if mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in [*model.encoder.layers, *model.decoder.layers]:
            fully_shard(layer)
        ddp = fully_shard(model)
    else:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), 0.1)
    src, tgt = A.sample_batch()
    watcher = None
    if run_dir != "-":
        import attnscope

        watcher = attnscope.watch(ddp, (src, tgt), every=2, run_dir=run_dir)
    torch.manual_seed(100 + rank)  # each rank its own dropout stream
    ddp.train()
    for step in range(6):
        rows = slice(rank, rank + 2)
        out_ = ddp(src[rows], tgt[rows])
        loss = -out_.gather(-1, tgt[rows][..., None]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if watcher is not None:
            watcher.step(step, loss=loss)
    if watcher is not None:
        watcher.close()
    state = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in model.state_dict().items()}
    save_file({k: v.contiguous() for k, v in state.items()}, f"{out}/rank{rank}.safetensors")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    out_dir, run, port, mode = sys.argv[1:5]
    mp.spawn(worker, args=(2, out_dir, run, port, mode), nprocs=2, join=True)
