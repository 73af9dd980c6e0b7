import torch

print(torch.cuda.memory_allocated())
