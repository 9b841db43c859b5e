"""Tensor parallelism: the model sharded over N ranks (one process per rank; rank 0 is the engine
process), applied as transforms after construction (tp_transform.py) and driven by an executor
the engine talks to like a runner (executor.py, worker.py)."""
