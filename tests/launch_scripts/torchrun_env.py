"""Prints the environment torchrun's agent gives a worker, as one line of JSON per rank (and whether the worker
leads a session of its own, as torchrun starts each one)."""
import json
import os

KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
        "ROLE_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_SIGNALS_TO_HANDLE")

if __name__ == "__main__":
    print("ENV " + json.dumps({**{key: os.environ.get(key) for key in KEYS},
                               "own_session": os.getsid(0) == os.getpid()}), flush=True)
