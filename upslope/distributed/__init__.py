"""The sharded learner: N learner processes over torch.distributed (DDP or FSDP2), the
micro-batch split across ranks, sharded checkpoints (DCP) and the weight stream from shards."""
