from torch.distributed.tensor.experimental._context_parallel._attention import _ContextParallel

_ContextParallel(seq_dim=2, attention_type=_ContextParallel.AttentionType.SDPA)  # runs: ring attention
_ContextParallel(seq_dim=2, attention_type=_ContextParallel.AttentionType.FLEX)  # refuses: flex attention
