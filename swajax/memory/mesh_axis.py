"""The tensor-parallel mesh axis. The KV pools split their head axis over it; attention's
`shard_map` and the models' parameter rules name it too, so it lives at the bottom layer that
all three import."""

AXIS = "tp"
