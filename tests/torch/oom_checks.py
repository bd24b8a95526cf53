"""How the tools that shrink a batch on out-of-memory recognise the error, for the tests that
check carve's refusals pass them (standard library only)."""


def lightning_is_oom(e):
    """pytorch_lightning.utilities.memory.is_cuda_out_of_memory."""
    return isinstance(e, RuntimeError) and len(e.args) == 1 and "CUDA" in e.args[0] and "out of memory" in e.args[0]


def accelerate_should_reduce(e):
    """accelerate.utils.memory.should_reduce_batch_size, its older statement and its newer one."""
    statements = ["CUDA out of memory.", " out of memory."]
    return isinstance(e, RuntimeError) and len(e.args) == 1 and any(s in e.args[0] for s in statements)
