"""Rank 0 joins a worker thread that blocks in a C call (time.sleep), so it never reaches the broadcast."""
import threading
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
x = torch.arange(4.0)
if dist.get_rank() == 0:
    prefetch = threading.Thread(target=time.sleep, args=(600,))
    prefetch.start()
    prefetch.join()
dist.broadcast(x, src=0)
