"""What a rank sees of its host: its name (every API that tells it), its disk, its threads. Rank 0 writes a
checkpoint to a relative path; after a barrier every rank looks for it there."""
import os
import platform
import socket
import tempfile

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
name = socket.gethostname()
names = {name, platform.node(), os.uname().nodename, os.environ["HOSTNAME"], socket.getfqdn()}
if dist.get_rank() == 0:
    torch.save({"step": 1}, "checkpoint.pt")
dist.barrier()
print(f"{name}:{os.environ['LOCAL_RANK']} names={sorted(names)} resolves={socket.gethostbyname(name)} "
      f"checkpoint={os.path.exists('checkpoint.pt')} cwd={os.getcwd()} tmp={tempfile.gettempdir()} "
      f"threads={torch.get_num_threads()} omp={os.environ.get('OMP_NUM_THREADS')}")
dist.destroy_process_group()
