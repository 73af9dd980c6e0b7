"""Rank 2 never reaches the monitored_barrier: rank 0's monitored_barrier raises naming it after its timeout, and
the others wait for rank 0."""
import datetime
import time

import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 2:
    time.sleep(600)
dist.monitored_barrier(timeout=datetime.timedelta(seconds=1))
print("passed")
