import torch

print(torch.cuda.list_gpu_processes())
