"""Compile a PyTorch program as a tuned Inductor candidate: the tuner's trials and a service that
loads an export run this same code.

This module needs torch alone (no gpt_optuna import), so a service can copy it: ``load(path)``
opens what ``gpt-optuna export`` wrote for an ``inductor`` trial (the program ``NAME.pt2``, its
side file ``NAME.pt2.json`` and Inductor's saved caches ``NAME.pt2.cache``) and compiles it as the
trial was, warm from the caches::

    from gpt_optuna.backends.inductor.deploy import load
    model = load("served/model.pt2")
    outputs = model(*inputs)  # torch tensors or numpy arrays, in the program's input order
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

SECTION = "inductor"
"""The side file's section with what :class:`CompiledProgram` takes (``settings``)."""
CACHE_SUFFIX = ".cache"


class CompiledProgram:
    """A program compiled with a candidate's ``settings``: ``options`` (``torch.compile``'s),
    ``precision`` (fp32, tf32, fp16, bf16), ``sdpa_backend`` and ``device``. Calling it runs the
    compiled program on inputs of the shapes it was compiled for, in the program's order, each
    floating one cast to the precision's dtype, and returns the outputs (a flat list) in float32
    where the precision computed in another floating dtype. ``cache``: Inductor's saved caches,
    loaded before the compile."""

    def __init__(self, program: Any, settings: Mapping[str, Any], cache: bytes | None = None) -> None:
        import torch

        self.settings = dict(settings)
        self.device = torch.device(self.settings.get("device", "cpu"))
        self.dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(self.settings.get("precision", "fp32"))
        if cache:
            torch.compiler.load_cache_artifacts(cache)
        module = program.module().to(self.device)
        if self.dtype is not None:
            module = module.to(self.dtype)
        options = dict(self.settings.get("options", {}))
        self.cudagraphs = bool(options.get("triton.cudagraphs", False))
        self.compiled = False
        self.function = torch.compile(module, backend="inductor", options=options, fullgraph=True, dynamic=False)

    def inputs(self, values: list[Any]) -> list[Any]:
        """``values`` (tensors or numpy arrays) as the compiled program takes them: on its device,
        floating ones in the precision's dtype."""
        import torch

        tensors = [v if isinstance(v, torch.Tensor) else torch.tensor(v) for v in values]  # numpy: copied
        return [
            t.to(self.device, self.dtype if self.dtype is not None and t.is_floating_point() else t.dtype)
            for t in tensors
        ]

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        """No autograd, the precision's TF32 setting and the attention backend, set for a call and
        restored after it (a process may hold candidates of several settings)."""
        import torch

        matmul = torch.backends.cuda.matmul
        before = matmul.allow_tf32
        matmul.allow_tf32 = self.settings.get("precision") == "tf32"
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            backend = self.settings.get("sdpa_backend", "default")
            if backend != "default":
                from torch.nn.attention import SDPBackend, sdpa_kernel

                chosen = {
                    "flash": SDPBackend.FLASH_ATTENTION,
                    "efficient": SDPBackend.EFFICIENT_ATTENTION,
                    "cudnn": SDPBackend.CUDNN_ATTENTION,
                    "math": SDPBackend.MATH,
                }[backend]
                stack.enter_context(sdpa_kernel([chosen]))
            try:
                yield
            finally:
                matmul.allow_tf32 = before

    def run(self, inputs: list[Any]) -> list[Any]:
        """One call on inputs :meth:`inputs` made; the outputs as the program returns them (no copy:
        with CUDA graphs they are overwritten by the next call). The first compiles, with cache
        keys that do not depend on the process's imports (:func:`stable_cache_keys`)."""
        import torch
        from torch.utils import _pytree

        if self.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        with contextlib.nullcontext() if self.compiled else stable_cache_keys():
            outputs = list(_pytree.tree_leaves(self.function(*inputs)))
        self.compiled = True
        return outputs

    def __call__(self, *values: Any) -> list[Any]:
        with self.context():
            outputs = self.run(self.inputs(list(values)))
            return [o.float() if self.dtype is not None and o.is_floating_point() else o.clone() for o in outputs]


def _memory_format(name: str) -> Any:
    import torch

    return getattr(torch, name)


@contextlib.contextmanager
def stable_cache_keys() -> Iterator[None]:
    """Memory formats pickled by name while Inductor hashes a graph for its caches. Pickle finds a
    memory format under the first imported module holding ``torch``, so without this a compile
    keys its caches by the process's import order, and the caches an export ships miss in a service
    that imported its modules in another order."""
    import copyreg

    import torch

    before = copyreg.dispatch_table.get(torch.memory_format)
    copyreg.dispatch_table[torch.memory_format] = lambda fmt: (_memory_format, (str(fmt).removeprefix("torch."),))
    try:
        yield
    finally:
        if before is None:
            del copyreg.dispatch_table[torch.memory_format]
        else:
            copyreg.dispatch_table[torch.memory_format] = before


def load(path: str | Path) -> CompiledProgram:
    """The exported program at ``path``, compiled as its trial was (warm from the caches saved
    beside it), on the device it was tuned on."""
    import torch

    path = Path(path)
    side = json.loads(Path(f"{path}.json").read_text())
    if SECTION not in side:
        raise ValueError(f"{path} is a {side.get('backend')} export, not an inductor one")
    cache_path = Path(f"{path}{CACHE_SUFFIX}")
    cache = cache_path.read_bytes() if cache_path.is_file() else None
    return CompiledProgram(torch.export.load(str(path)), side[SECTION], cache)
