"""Scale-out: FSDP2 sharding, weight sync into serving engines, distributed checkpoints and export."""
