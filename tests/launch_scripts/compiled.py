"""torch.compile of a module and a function, and Module.compile(): each gives eager PyTorch's result."""
import torch
import torch.distributed as dist

if __name__ == "__main__":
    dist.init_process_group("gloo")
    model = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    compiled = torch.compile(model)
    twice = torch.compile(lambda t: t * 2, mode="max-autotune-no-cudagraphs")
    assert torch.equal(compiled(x), model(x)) and torch.equal(twice(x), x * 2)
    model.compile()
    assert torch.equal(model(x), compiled(x))
    dist.destroy_process_group()
