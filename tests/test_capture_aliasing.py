"""Records hold what the model used, whatever the model (or its caller) writes afterwards.

A softmax path's record holds the weights the model itself wrote, without a copy. A later write into that
memory (a buffer the next layer's softmax writes again, weights turned into log-weights for display after
the product, maps edited after the block) must not reach the record; the values and projections what
attention moves is read from must not be read after they changed (a KV cache's next step, an optimizer
step): then nothing is shown rather than something the model never moved."""

from __future__ import annotations

import torch
from torch import nn

from attnscope.core.families.capture import capture_attention


class BufferAttention(nn.Module):
    """Softmax written into a buffer every layer shares (``torch.softmax(s, -1, out=buf)``)."""

    def __init__(self, d: int, h: int, buf: torch.Tensor):
        super().__init__()
        self.h, self.qkv, self.buf = h, nn.Linear(d, 3 * d), buf

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-1, -2) / (d // self.h) ** 0.5
        torch.softmax(s, -1, out=self.buf)
        self.used = self.buf.clone()
        return (self.buf @ v).transpose(1, 2).reshape(b, n, d)


class SharedBuffer(nn.Module):
    def __init__(self, d=16, h=2, b=2, n=5):
        super().__init__()
        buf = torch.empty(b, h, n, n)
        self.layers = nn.ModuleList([BufferAttention(d, h, buf) for _ in range(3)])

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


class ShowsLogWeights(nn.Module):
    """Returns its weights, turned into log-weights in place after the product (for display)."""

    def __init__(self, d=16, h=2, log_inside=True):
        super().__init__()
        self.h, self.qkv, self.log_inside = h, nn.Linear(d, 3 * d), log_inside

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-1, -2) / (d // self.h) ** 0.5).softmax(-1)
        self.used = attn.clone()
        out = (attn @ v).transpose(1, 2).reshape(b, n, d)
        if self.log_inside:
            attn.add_(1e-6).log_()
        return out, attn


def test_a_buffer_every_layer_writes_its_weights_into_records_each_layers_own():
    torch.manual_seed(0)
    model, x = SharedBuffer().eval(), torch.randn(2, 5, 16)
    with torch.no_grad(), capture_attention(model) as cap:
        model(x)
    assert len(cap.records) == 3
    for rec, layer in zip(cap.records, model.layers, strict=True):
        assert rec.exact
        torch.testing.assert_close(rec.probs, layer.used, rtol=0, atol=0)
    assert not torch.equal(cap.records[0].probs, cap.records[2].probs)


def test_weights_edited_in_place_after_the_product_are_recorded_as_used():
    torch.manual_seed(0)
    model, x = ShowsLogWeights().eval(), torch.randn(2, 5, 16)
    with torch.no_grad(), capture_attention(model) as cap:
        _, shown = model(x)
    (rec,) = cap.records
    assert rec.exact and float(shown.min()) < 0  # the model's own tensor holds log-weights now
    torch.testing.assert_close(rec.probs, model.used, rtol=0, atol=0)
    assert rec.values is not None and rec.values.values is not None  # the weights met these values


def test_maps_the_model_returned_and_the_caller_edits_after_the_block_leave_the_records_alone():
    torch.manual_seed(0)
    model, x = ShowsLogWeights(log_inside=False).eval(), torch.randn(2, 5, 16)
    with torch.no_grad(), capture_attention(model) as cap:
        _, attn = model(x)
    attn.mul_(0)  # the caller's own post-processing of the maps it got back
    torch.testing.assert_close(cap.records[0].probs, model.used, rtol=0, atol=0)


def test_what_moves_is_not_read_from_parameters_an_optimizer_step_changed():
    """nn.MultiheadAttention's values are made on first use from its input and parameters: after a
    training step wrote them, they are not what moved, so no norms are shown (they were the new ones)."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad(), capture_attention(mha) as cap:
        mha(x, x, x)
    before = cap.records[0].values.norms()
    assert before is not None and torch.isfinite(before).all()
    with torch.no_grad(), capture_attention(mha) as again:
        mha(x, x, x)
    with torch.no_grad():
        mha.in_proj_weight.mul_(2.0)  # an optimizer step, in place
    assert again.records[0].values.norms() is None
    assert again.kind_maps("enc_self").value_norms is None


def test_values_a_later_step_writes_are_not_read_as_what_moved():
    """A softmax path's values are read on first use: a KV-cache-like buffer written after the product
    (the next step) leaves them unread."""
    torch.manual_seed(0)

    class Cached(nn.Module):
        def __init__(self, d=16, h=2):
            super().__init__()
            self.h, self.qkv = h, nn.Linear(d, 3 * d)

        def forward(self, x):
            b, n, d = x.shape
            q, k, v = self.qkv(x).view(b, n, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
            w = (q @ k.transpose(-1, -2) / (d // self.h) ** 0.5).softmax(-1)
            out = (w @ v).transpose(1, 2).reshape(b, n, d)
            self.cache = v
            return out

    model, x = Cached().eval(), torch.randn(2, 5, 16)
    with torch.no_grad(), capture_attention(model) as cap:
        model(x)
    assert cap.records[0].values is not None and cap.records[0].values.intact()
    with torch.no_grad():
        model.cache.zero_()
    assert cap.records[0].values.values is None


class Workspace(nn.Module):
    """Every layer computes in one preallocated workspace: scores, weights and output all with ``out=``."""

    def __init__(self, d=16, h=2, b=2, n=5, layers=3):
        super().__init__()
        self.h = h
        self.qkv = nn.ModuleList([nn.Linear(d, 3 * d) for _ in range(layers)])
        self.scores, self.probs = torch.empty(b, h, n, n), torch.empty(b, h, n, n)
        self.ctx = torch.empty(b, h, n, d // h)
        self.used: list[torch.Tensor] = []

    def forward(self, x):
        b, n, d = x.shape
        self.used = []
        for qkv in self.qkv:
            q, k, v = qkv(x).view(b, n, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
            torch.matmul(q, k.transpose(-1, -2), out=self.scores)
            self.scores.mul_((d // self.h) ** -0.5)
            torch.softmax(self.scores, -1, out=self.probs)
            self.used.append(self.probs.clone())
            torch.matmul(self.probs, v, out=self.ctx)
            x = x + self.ctx.transpose(1, 2).reshape(b, n, d)
        return x


def test_records_of_a_shared_workspace_hold_each_layers_weights_flagged_or_not():
    """Scores written into the workspace lose their lineage (so the records are flagged); whatever the
    flag, each record's numbers are its own layer's, not the last layer's that the workspace holds."""
    torch.manual_seed(0)
    model, x = Workspace().eval(), torch.randn(2, 5, 16)
    with torch.no_grad(), capture_attention(model) as cap:
        model(x)
    assert len(cap.records) == 3
    for rec, used in zip(cap.records, model.used, strict=True):
        torch.testing.assert_close(rec.probs, used, rtol=0, atol=0)


class KeptForPlotting(nn.Module):
    """Lightning's and fastai's way: the weights kept for plotting as numpy (``attn.detach().cpu().numpy()``,
    which shares the tensor's memory on the CPU), then edited in place for display (small weights zeroed, rounded),
    writes torch never sees."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.qkv = nn.Linear(8, 24)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, 2, 4).permute(2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-1, -2) / 2.0).softmax(-1)
        out = attn @ v
        self.used = attn.clone()
        kept = attn.detach().cpu().numpy() if self.how == "numpy" else attn.detach().__array__()
        kept[kept < 0.2] = 0
        kept.round(1, out=kept)
        return out.transpose(1, 2).reshape(b, n, 8)


def test_weights_kept_as_numpy_and_edited_there_leave_the_record_as_used():
    for how in ("numpy", "__array__"):
        torch.manual_seed(5)
        model = KeptForPlotting(how).eval()
        with torch.no_grad(), capture_attention(model) as cap:
            model(torch.randn(2, 6, 8))
        (rec,) = cap.records
        assert torch.equal(rec.probs, model.used), how
