"""Builds libcarve_torch.so (and libcarve_torch_oom.so, where PyTorch's c10 is found) with CMake for
the local CUDA toolkit and puts them in the carve_gpu package, where carve_gpu.library finds them:
`pip install .` (with `--no-build-isolation` to build against the PyTorch already installed).

CMAKE_ARGS adds arguments to CMake's configure step (e.g. -DCARVE_TORCH_PREFIX=...), as other
CMake-built Python packages read it. Standard library and setuptools only.
"""

import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
LIBRARIES = ("libcarve_torch.so", "libcarve_torch_oom.so")


class BuildWithLibraries(build_py):
    """build_py, then the CMake targets carve_torch (and carve_torch_oom) copied into carve_gpu/."""

    def run(self):
        super().run()
        with tempfile.TemporaryDirectory(prefix="carve_gpu_build_") as build:
            configure = ["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DCARVE_BUILD_TESTS=OFF",
                         "-DCARVE_BUILD_EXAMPLES=OFF", "-DCARVE_BUILD_BENCHMARKS=OFF", "-DCARVE_ENABLE_CUDA=OFF",
                         "-DCARVE_BUILD_TORCH=ON", f"-DCARVE_PYTHON3={sys.executable}"]
            configure += shlex.split(os.environ.get("CMAKE_ARGS", ""))
            subprocess.run(configure, check=True)
            # The c10 bridge exists only where CMake found PyTorch; without it carve_gpu.torch says so.
            targets = ["carve_torch"]
            with open(os.path.join(build, "CMakeCache.txt")) as cache:
                c10 = [line for line in cache if line.startswith("CARVE_C10_LIBRARY:")]
            if c10 and not c10[0].rstrip().endswith("NOTFOUND"):
                targets.append("carve_torch_oom")
            jobs = str(os.cpu_count() or 1)
            subprocess.run(["cmake", "--build", build, "--parallel", jobs, "--target", *targets], check=True)
            package = os.path.join(self.build_lib, "carve_gpu")
            os.makedirs(package, exist_ok=True)
            for name in LIBRARIES:
                built = os.path.join(build, "src", "torch", name)
                if os.path.isfile(built):
                    shutil.copy2(built, os.path.join(package, name))


setup(cmdclass={"build_py": BuildWithLibraries})
