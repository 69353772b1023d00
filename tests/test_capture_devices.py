"""attnscope.core.families.capture and devices.

On a GPU, every model of tests/usermodels, run on CUDA, gives the records it gives on the CPU (the same calls,
names, kinds, layouts, flags, masks and notes) and the maps the model itself computed on the GPU: capture's
bookkeeping (lineage codes, masks, recomputed SDPA weights) follows the tensors' device. That test needs a CUDA
device; without one it is skipped (CI has none).

Everywhere: a TorchFunctionMode set below capture's (torch's default device, ``torch.device("cuda")`` or
``set_default_device``; a user's op counter) applies to the model's ops alone. Capture's own tensors are made
where capture says (they were put on the default device and mixed with the CPU's, and every record was lost),
and a counting mode sees the model's ops, not capture's."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from attnscope.core.families.capture import capture_attention

STYLES = sorted(p.stem for p in (Path(__file__).parent / "usermodels").glob("*.py") if p.stem != "__init__")


def _to(x, device, keep_lengths=False):
    """The batch on ``device``; with ``keep_lengths``, 1-D integer tensors stay on the CPU
    (``pack_padded_sequence`` wants its lengths there)."""
    if isinstance(x, torch.Tensor):
        if keep_lengths and x.dim() == 1 and not x.is_floating_point():
            return x
        return x.to(device)
    if isinstance(x, (tuple, list)):
        return type(x)(_to(v, device, keep_lengths) for v in x)
    if isinstance(x, dict):
        return {k: _to(v, device, keep_lengths) for k, v in x.items()}
    return x


def _capture(model, batch):
    if hasattr(model, "reset"):
        model.reset()
    with torch.no_grad(), capture_attention(model) as cap:
        model(*batch)
    return cap, list(getattr(model, "computed", []))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")
@pytest.mark.parametrize("name", STYLES)
def test_capture_on_cuda_gives_what_it_gives_on_the_cpu(name):
    mod = importlib.import_module(f"usermodels.{name}")
    model, batch = mod.build(), mod.sample_batch()
    # the model's own code as written for the CPU (``torch.ones(n)``, ``torch.arange(n)``) runs on the GPU
    # under torch's default device, a TorchFunctionMode below capture's, as a user moving to a GPU runs it;
    # the CPU run is made under one too, so both take the same paths (torch's fused encoder layers leave
    # their fast path under any mode)
    torch.manual_seed(0)
    with torch.device("cpu"):
        cpu, _ = _capture(model, batch)
    with torch.device("cuda"):
        gpu_model = mod.build()  # (a deepcopy fails on modules that keep a non-leaf tensor)
        gpu_model.load_state_dict(model.state_dict())
        gpu_model.to("cuda")
        for keep_lengths in (False, True):
            gpu_batch = _to(batch, "cuda", keep_lengths)
            try:
                if hasattr(gpu_model, "reset"):
                    gpu_model.reset()
                with torch.no_grad():
                    gpu_model(*gpu_batch)
                break
            except RuntimeError:
                if keep_lengths:
                    raise
        torch.manual_seed(0)
        gpu, truth = _capture(gpu_model, gpu_batch)

    def said(cap):
        return [
            (r.name, r.kind, r.source, r.exact, r.flag, r.key_labels, r.query_labels) for r in cap.records
        ]

    assert said(gpu) == said(cpu)
    assert gpu.notes == cpu.notes
    assert [str(n) for n in gpu.skipped] == [str(n) for n in cpu.skipped]
    for i, (g, c) in enumerate(zip(gpu.records, cpu.records, strict=True)):
        assert g.probs.device.type == "cuda", (i, g.name)
        assert g.probs.shape == c.probs.shape, (i, g.name)
        assert (g.mask is None) == (c.mask is None) and g.mask_source == c.mask_source, (i, g.name)
        if g.mask is not None:
            assert torch.equal(g.mask.cpu(), c.mask), (i, g.name)
        if not any(m.training for m in model.modules()):  # (dropout draws differ between devices)
            torch.testing.assert_close(g.probs.cpu(), c.probs, atol=1e-4, rtol=1e-4, msg=f"{name} {i}")
    # the maps the model computed on the GPU itself, where it keeps them
    for i, (rec, item) in enumerate(zip(gpu.records, truth, strict=False)):
        probs = item[1] if isinstance(item, tuple) else item
        if isinstance(probs, torch.Tensor) and probs.shape == rec.probs.shape:
            want = probs.to(rec.probs.dtype)
            torch.testing.assert_close(rec.probs, want, atol=1e-5, rtol=0, msg=f"{name} {i}")


class _Count(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(getattr(func, "__name__", "?"))
        return func(*args, **(kwargs or {}))


MODE_STYLES = ["annotated", "nanogpt", "torch_transformer", "headmajor", "einops_lucidrains", "llama_meta"]


@pytest.mark.parametrize("name", MODE_STYLES)
def test_a_mode_below_capture_sees_the_models_ops_alone(name):
    mod = importlib.import_module(f"usermodels.{name}")
    model, batch = mod.build(), mod.sample_batch()
    alone, _ = _capture(model, batch)
    with torch.no_grad():
        if hasattr(model, "reset"):
            model.reset()
        with _Count() as plain:
            model(*batch)
        if hasattr(model, "reset"):
            model.reset()
        with _Count() as below, capture_attention(model) as cap:
            model(*batch)
    assert below.seen == plain.seen  # (capture's bookkeeping made thousands of calls it saw)
    assert cap.notes == alone.notes
    assert [(r.name, r.kind) for r in cap.records] == [(r.name, r.kind) for r in alone.records]
    assert [r.exact for r in cap.records] == [r.exact for r in alone.records]
    if name == "torch_transformer":  # under any mode torch's encoder layers leave their fused fast path:
        return  # the model itself weighs its padded query rows then (its Python path), so the maps differ there
    for got, want in zip(cap.records, alone.records, strict=True):
        assert torch.equal(got.probs, want.probs)


# styles whose own code makes no tensor of its own (under a meta default device, those would be the model's)
META_STYLES = ["nanogpt", "headmajor", "einops_lucidrains", "llama_meta", "additive", "d2l", "tutorial"]


@pytest.mark.parametrize("name", META_STYLES)
def test_capture_under_a_default_device_keeps_its_own_tensors_off_it(name):
    """``torch.device("meta")`` stands in for a user's ``torch.set_default_device("cuda")`` on a machine
    without a GPU: capture's own codes and masks, made on the default device, met the model's CPU tensors."""
    mod = importlib.import_module(f"usermodels.{name}")
    model, batch = mod.build(), mod.sample_batch()
    alone, _ = _capture(model, batch)
    with torch.device("meta"):
        cap, _ = _capture(model, batch)
    assert cap.notes == alone.notes and len(cap.records) == len(alone.records) > 0, cap.notes
    for got, want in zip(cap.records, alone.records, strict=True):
        assert (got.name, got.kind, got.exact) == (want.name, want.kind, want.exact)
        assert got.mask_source == want.mask_source
        assert torch.equal(got.probs, want.probs)
        assert (got.mask is None and want.mask is None) or torch.equal(got.mask, want.mask)
