"""torchrun's fault-tolerance pattern (the DDP tutorial series' multigpu_torchrun.py): local rank 0 of each host
saves a snapshot to a relative path after every epoch; after a failure torchrun restarts every rank, and each
resumes from the snapshot it finds. The rank given as argument fails once, in epoch 1 of the first attempt."""
import os
import sys

import torch
import torch.distributed as dist

EPOCHS = 4
dist.init_process_group("nccl")
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
start = torch.load("snapshot.pt")["epochs_run"] if os.path.exists("snapshot.pt") else 0
print(f"attempt {restart} of {int(os.environ['TORCHELASTIC_MAX_RESTARTS']) + 1} starts at epoch {start}")
for epoch in range(start, EPOCHS):
    total = torch.ones(1, device="cuda")
    dist.all_reduce(total)
    if int(os.environ["LOCAL_RANK"]) == 0:
        torch.save({"epochs_run": epoch + 1}, "snapshot.pt")
    dist.barrier()
    if epoch == 1 and restart == 0 and dist.get_rank() == int(sys.argv[1]):
        raise RuntimeError(f"simulated fault on rank {dist.get_rank()}")
print(f"trained {EPOCHS} epochs")
dist.destroy_process_group()
