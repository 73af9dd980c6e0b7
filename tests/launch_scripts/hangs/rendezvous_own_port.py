"""A tutorial's set-up run under torchrun: the script sets MASTER_ADDR and MASTER_PORT itself, as its mp.spawn
version did. torchrun's workers connect to the agent's store as clients (TORCHELASTIC_USE_AGENT_STORE), so every
rank connects to a port nobody serves and waits in init_process_group's rendezvous; plain torchrun hangs the same
way. No rank is to blame more than another: the job never formed."""
import os
import socket

import torch.distributed as dist

if __name__ == "__main__":
    with socket.socket() as probe:  # a port nobody serves (bound, then let go)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo")
    dist.barrier()
