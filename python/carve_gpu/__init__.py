"""carve's pools as the GPU allocator of PyTorch and CuPy, through libcarve_torch.so.

    import carve_gpu.torch
    carve_gpu.torch.use()                 # before the first CUDA tensor
    ...                                   # train as usual
    print(carve_gpu.torch.memory_stats())

The library is found, in this order: the `library` argument of use(), the CARVE_TORCH_LIBRARY
environment variable, `libcarve_torch.so` next to this package, and the newest
`build/*/src/torch/libcarve_torch.so` of the carve checkout this package sits in (see
carve_gpu.library.find_library). docs/torch.md is the guide.
"""

from .library import POOLS, CarveLibrary, find_library, load, parse_stats

__all__ = ["POOLS", "CarveLibrary", "find_library", "load", "parse_stats"]
