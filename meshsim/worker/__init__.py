"""The worker side: the only code in meshsim that calls torch.distributed."""
