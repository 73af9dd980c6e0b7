"""4-stage pipeline with tied input/output embeddings, 2 data-parallel replicas (one per host).

Mesh ("dp", "pp") = (2, 4). Stages talk over 2-member groups (one per adjacent stage pair, plus the wrap-around
pair last->first that carries the gradient of the tied embedding, as in Megatron's embedding group). Activations
flow forward with broadcasts on the pair groups; after the forward the last stage sends the output-embedding
gradient back to the first stage, then every stage all-reduces its gradients over dp.

Held out (written blind, outside meshsim's tests, 2026-11-27; missed blind: the first stages wait at a line the
other stages never reach, so no line showed the pattern):
pp_tied_embed_ring [0, 4] (pipeline cycle, broadcasts on pair groups; mesh (2,4) dp x pp). A sync point moved to
the top of the step makes the first stage receive the tied-embedding gradient from the last stage (the wrap-around
pair) before it sends its activations, while every other stage receives from the stage before it: 0 <- 3 <- 2 <- 1
<- 0, and 4 <- 7 <- 6 <- 5 <- 4.
"""
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

HID, VOCAB, MICRO, MB_SIZE, STEPS = 16, 32, 2, 4, 2


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "pp"))
    dp_pg = mesh.get_group("dp")
    stage, n_stages = mesh.get_local_rank("pp"), mesh.size(1)
    pp_ranks = mesh["pp"].mesh.tolist()

    # pair groups, created by every rank in the same order
    pair_pg = {}
    for replica in mesh.mesh.tolist():
        for s in range(n_stages):
            a, b = replica[s], replica[(s + 1) % n_stages]
            pg = dist.new_group(sorted([a, b]))
            if rank in (a, b):
                pair_pg[(a, b)] = pg
    prev_rank, next_rank = pp_ranks[stage - 1], pp_ranks[(stage + 1) % n_stages]
    from_prev = pair_pg[(prev_rank, rank)]
    to_next = pair_pg[(rank, next_rank)]

    torch.manual_seed(0)
    embedding = torch.randn(VOCAB, HID) * 0.1  # tied: used by the first and the last stage
    layer = torch.randn(HID, HID) * 0.1 + torch.eye(HID)
    g = torch.Generator().manual_seed(7 + mesh.get_local_rank("dp"))

    for step in range(STEPS):
        tied_grad = torch.zeros_like(embedding)
        layer_grad = torch.zeros_like(layer)
        if stage == 0 and step % 2 == 0:
            # sync point for the tied embedding: pick up the last stage's embedding gradient
            dist.broadcast(tied_grad, src=prev_rank, group=from_prev)
        for _mb in range(MICRO):
            tokens = torch.randint(0, VOCAB, (MB_SIZE,), generator=g)
            if stage == 0:
                act = embedding[tokens]
            else:
                act = torch.empty(MB_SIZE, HID)
                dist.broadcast(act, src=prev_rank, group=from_prev)
            out = torch.tanh(act @ layer)
            layer_grad += act.T @ (1 - out ** 2) / MB_SIZE
            if stage < n_stages - 1:
                dist.broadcast(out.contiguous(), src=rank, group=to_next)
            else:
                logits = out @ embedding.T
                tied_grad += torch.softmax(logits, -1).T @ out / MB_SIZE
        if stage == n_stages - 1:
            dist.broadcast(tied_grad, src=rank, group=to_next)  # wrap-around: last -> first
        dist.all_reduce(layer_grad, group=dp_pg)
        layer -= 0.01 * layer_grad / mesh.size(0)
        if stage in (0, n_stages - 1):
            embedding -= 0.01 * tied_grad
        if rank == 0:
            print(f"step {step} done", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
