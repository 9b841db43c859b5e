"""The runners: the only owners of device memory (KV cache, staging buffers, CUDA graphs).
They run the model for one scheduled step and sample its tokens."""
