"""Sampling reads nothing back from the device but the sampled ids, once.

On a GPU every read-back (`.item()`, `.tolist()`, `bool(t)`, boolean-mask indexing, a blocking
host-to-device copy) makes the host wait for the queued forward pass. The check here is on the
CPU: a torch function mode records each call that would wait on a GPU.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from kvscale_engine.layers.sampler import SampleRequest, sample
from kvscale_engine.sampling_params import SamplingParams

READ_BACKS = {"item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__int__", "__float__"}
READ_BACKS |= {"__index__", "masked_select"}


class SyncRecorder(TorchFunctionMode):
    """Names the calls that would make the host wait for the device on CUDA."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: list[str] = []

    def __torch_function__(
        self, func: Any, types: Any, args: Any = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if name in READ_BACKS:
            self.syncs.append(name)
        elif name in ("__getitem__", "__setitem__") and _bool_index(args[1]):
            self.syncs.append(f"{name}[bool mask]")
        elif name == "tensor" and "device" in kwargs:
            self.syncs.append("tensor(device=) blocking copy")
        elif name in ("to", "copy_") and not kwargs.get("non_blocking", False):
            self.syncs.append(f"{name} blocking copy")
        return func(*args, **kwargs)


def _bool_index(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


MIXES = {
    "greedy": [SamplingParams(temperature=0.0)] * 3,
    "temperature": [SamplingParams(temperature=0.8), SamplingParams(temperature=1.3, seed=7)],
    "top-p and top-k": [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, top_p=0.5),
        SamplingParams(temperature=0.7, top_k=3, seed=1),
    ],
}


@pytest.mark.parametrize("mix", list(MIXES))
def test_only_the_sampled_ids_are_read_back(mix: str) -> None:
    requests = [SampleRequest(p, output_index=2) for p in MIXES[mix]]
    logits = torch.randn(len(requests), 50, generator=torch.Generator().manual_seed(0))
    recorder = SyncRecorder()
    with recorder:
        tokens = sample(logits, requests, torch.Generator().manual_seed(0))
    assert recorder.syncs == ["tolist"]
    assert len(tokens) == len(requests) and all(0 <= t < 50 for t in tokens)


def test_recorder_sees_a_boolean_mask_write() -> None:
    recorder = SyncRecorder()
    x = torch.zeros(4)
    with recorder:
        x[x > 0] = 1.0
        x.sum().item()
    assert recorder.syncs == ["__setitem__[bool mask]", "item"]


def test_greedy_rows_take_the_argmax_and_top_k_1_is_greedy() -> None:
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(3))
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.9, top_k=1, seed=5),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=2.0, top_p=1e-6),
    ]
    requests = [SampleRequest(p, output_index=0) for p in params]
    tokens = sample(logits, requests, torch.Generator().manual_seed(0))
    assert tokens == logits.argmax(dim=-1).tolist()


def test_seeded_rows_do_not_depend_on_the_batch() -> None:
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(4))
    seeded = SampleRequest(SamplingParams(temperature=1.0, top_p=0.9, seed=11), output_index=3)
    other = SampleRequest(SamplingParams(temperature=1.0), output_index=0)
    alone = sample(logits[1:2], [seeded], torch.Generator().manual_seed(0))
    batched = sample(logits, [other, seeded, other], torch.Generator().manual_seed(9))
    assert batched[1] == alone[0]
