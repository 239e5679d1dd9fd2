"""Where an installed msa keeps its C++ package, for extension authors:

    cmake -Dmsa_DIR=$(python -c "import msa; print(msa.cmake_dir())") ...

then find_package(msa CONFIG REQUIRED) and link msa::msa (headers, libmsa.a, OpenMP, and CUDA
when this build has it).
"""

from __future__ import annotations

import os

from . import _C

# The build installs include/, lib/ and bin/ next to the extension module, which in an editable
# install is not the folder of this file.
_ROOT = os.path.dirname(os.path.abspath(_C.__file__))


def _existing(path: str) -> str:
    if not os.path.exists(path):
        raise FileNotFoundError(f"msa: {path} is missing from this installation of msa-attention")
    return path


def cmake_dir() -> str:
    """The folder of msaConfig.cmake: pass it as msa_DIR to CMake."""
    return _existing(os.path.join(_ROOT, "lib", "cmake", "msa"))


def include_dir() -> str:
    """The folder holding msa/*.h. Without CMake, also add <include_dir>/msa/third_party, where
    msa keeps the dlpack/dlpack.h that msa/dlpack.h includes."""
    return _existing(os.path.join(_ROOT, "include"))
