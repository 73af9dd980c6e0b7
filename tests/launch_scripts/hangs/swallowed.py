"""Rank 2 raises while loading its shard; the exception is caught, printed and the function returns, so rank 2
never makes the all_reduce the others wait in."""
import torch
import torch.distributed as dist


def load_shard(rank):
    if rank == 2:
        raise FileNotFoundError(f"shard {rank} is missing")
    return torch.ones(4)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        x = load_shard(rank)
    except Exception as exc:
        print("could not load:", exc)
        return
    dist.all_reduce(x)
    print("sum", x[0].item())


main()
