"""Loaded by every Python under scripts/as_avx2.sh: torch reports no AVX-512 and no AMX, so
vLLM's CPU platform loads its AVX2 kernels (`vllm._C_AVX2`) and picks its non-AMX attention,
as on an AVX2-only CPU. The patch is applied when `torch.cpu` is first imported (no torch import
here: most Python processes of the suite never load it)."""

import importlib.abc
import importlib.machinery
import os
import sys

_WIDE = ("_is_avx512_supported", "_is_avx512_vnni_supported", "_is_avx512_bf16_supported",
         "_is_amx_tile_supported", "_is_amx_fp16_supported")


class _NarrowTorchCpu(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch.cpu":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            for fn in _WIDE:
                if hasattr(module, fn):
                    setattr(module, fn, lambda: False)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("METRONOME_AS_AVX2") == "1":
    sys.meta_path.insert(0, _NarrowTorchCpu())
