"""Engine bookkeeping that never touches a tensor: the engine loop, the scheduler, the block
manager and its KV-tier index, requests, tokenizing and output processing."""
