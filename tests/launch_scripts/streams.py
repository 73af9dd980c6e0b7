"""A line on stdout and one on stderr from every rank, each naming its host and local rank."""
import os
import socket
import sys

import torch

who = f"{socket.gethostname()}:{os.environ['LOCAL_RANK']}"
print(f"out {who} sees {torch.cuda.device_count()} gpus, attempt {os.environ['TORCHELASTIC_RESTART_COUNT']}")
print(f"err {who}", file=sys.stderr)
