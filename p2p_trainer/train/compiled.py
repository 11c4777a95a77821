"""`inner.compile`: the model's forward through torch.compile, checked before the run starts.

torch.compile is lazy: a missing compiler would only surface at the first forward, deep inside
inductor, after the peer has joined its swarm. So the tools inductor needs are looked for first,
and their absence is an error that says what to change. The compiled wrapper is used for the
forward only; the peer keeps the original module for its parameters, checkpoints and evaluation,
so no state_dict key carries the wrapper's `_orig_mod.` prefix.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import cast

import torch

from p2p_trainer.config import ConfigError

CXX_COMPILERS = ("g++", "c++", "clang++")


def compile_problem(device: torch.device) -> str | None:
    """Why torch.compile cannot work on `device` here, or None."""
    if device.type == "cpu":
        cxx = os.environ.get("CXX")
        if not (cxx and shutil.which(cxx)) and not any(shutil.which(c) for c in CXX_COMPILERS):
            return (
                "torch.compile on the CPU builds C++ kernels, and no C++ compiler was found "
                f"({', '.join(CXX_COMPILERS)} or $CXX): install one (apt-get install g++)"
            )
    elif device.type == "cuda" and importlib.util.find_spec("triton") is None:
        return "torch.compile on a CUDA device needs the triton package: pip install triton"
    return None


def compile_forward(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """`model` wrapped by torch.compile for the inner steps' forward; raises ConfigError where it
    cannot work."""
    problem = compile_problem(device)
    if problem is not None:
        raise ConfigError(f"inner.compile = true: {problem}, or set inner.compile = false")
    return cast(torch.nn.Module, torch.compile(model))
