"""Swin Transformer window attention (microsoft/Swin-Transformer ``swin_transformer.py``, the code every
Swin port copies): no tokens, a float feature map (B, H=4, W=4, C) embedded by an ``nn.Linear``;
every block splits it into 2x2 windows with ``x.view(B, H // ws, ws, W // ws, ws, C).permute(0, 1, 3, 2,
4, 5).reshape(-1, ws * ws, C)``, so the windows are folded into the batch (B_ = B * num_windows) and
every window is one "sequence" of 4 positions; ``qkv = self.qkv(x).reshape(B_, N, 3, heads, C //
heads).permute(2, 0, 3, 1, 4)``, ``q * scale``, ``q @ k.transpose(-2, -1)``, a learned relative
position bias table gathered with the registered ``relative_position_index`` buffer
(``table[index.view(-1)].view(N, N, -1).permute(2, 0, 1)``) and added, ``nn.Softmax(dim=-1)``. As in
Swin, the second block shifts the map with ``torch.roll`` by ws // 2 before partitioning and adds the
shifted-window mask (0 / -100) through ``attn.view(B_ // nW, nW, heads, N, N) + mask`` and back to
``view(-1, heads, N, N)``; windows are reversed (and the roll undone) afterwards.
forward(x) -> features (B, H, W, DIM).
"""

from __future__ import annotations

import torch
from torch import nn

IN_CHANS, DIM, N_HEADS, WINDOW, N_LAYERS, HEIGHT, WIDTH = 16, 32, 4, 2, 2, 4, 4


def window_partition(x: torch.Tensor, ws: int) -> torch.Tensor:
    B, H, W, C = x.shape
    return x.view(B, H // ws, ws, W // ws, ws, C).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, C)


def window_reverse(windows: torch.Tensor, ws: int, H: int, W: int) -> torch.Tensor:
    B = int(windows.shape[0] / (H * W / ws / ws))
    x = windows.view(B, H // ws, W // ws, ws, ws, -1)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(B, H, W, -1)


class WindowAttention(nn.Module):
    def __init__(self, dim: int, window_size: int, num_heads: int, sink: list):
        super().__init__()
        self.dim, self.window_size, self.num_heads, self.sink = (
            dim,
            (window_size, window_size),
            num_heads,
            sink,
        )
        self.scale = (dim // num_heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window_size - 1) * (2 * window_size - 1), num_heads)
        )
        coords_h = torch.arange(self.window_size[0])
        coords_w = torch.arange(self.window_size[1])
        coords = torch.stack(torch.meshgrid([coords_h, coords_w], indexing="ij"))  # 2, Wh, Ww
        coords_flatten = torch.flatten(coords, 1)  # 2, Wh*Ww
        relative_coords = coords_flatten[:, :, None] - coords_flatten[:, None, :]  # 2, Wh*Ww, Wh*Ww
        relative_coords = relative_coords.permute(1, 2, 0).contiguous()  # Wh*Ww, Wh*Ww, 2
        relative_coords[:, :, 0] += self.window_size[0] - 1  # shift to start from 0
        relative_coords[:, :, 1] += self.window_size[1] - 1
        relative_coords[:, :, 0] *= 2 * self.window_size[1] - 1
        relative_position_index = relative_coords.sum(-1)  # Wh*Ww, Wh*Ww
        self.register_buffer("relative_position_index", relative_position_index)
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim)
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.5)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # (B_, heads, N, d)
        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        relative_position_bias = self.relative_position_bias_table[
            self.relative_position_index.view(-1)
        ].view(
            self.window_size[0] * self.window_size[1], self.window_size[0] * self.window_size[1], -1
        )  # Wh*Ww, Wh*Ww, nH
        relative_position_bias = relative_position_bias.permute(2, 0, 1).contiguous()  # nH, Wh*Ww, Wh*Ww
        attn = attn + relative_position_bias.unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn = attn.view(B_ // nW, nW, self.num_heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.num_heads, N, N)
            attn = self.softmax(attn)
        else:
            attn = self.softmax(attn)
        self.sink.append(("enc_self", attn.detach().clone()))  # (B * nW, heads, N, N)
        x = (attn @ v).transpose(1, 2).reshape(B_, N, C)
        return self.proj(x)


class SwinTransformerBlock(nn.Module):
    def __init__(
        self, dim: int, input_resolution: tuple[int, int], num_heads: int, shift_size: int, sink: list
    ):
        super().__init__()
        self.input_resolution, self.window_size, self.shift_size = input_resolution, WINDOW, shift_size
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, WINDOW, num_heads, sink)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        if self.shift_size > 0:
            H, W = self.input_resolution
            img_mask = torch.zeros((1, H, W, 1))  # 1 H W 1
            slices = (
                slice(0, -self.window_size),
                slice(-self.window_size, -self.shift_size),
                slice(-self.shift_size, None),
            )
            cnt = 0
            for h in slices:
                for w in slices:
                    img_mask[:, h, w, :] = cnt
                    cnt += 1
            mask_windows = window_partition(img_mask, self.window_size)  # nW, ws*ws, 1
            mask_windows = mask_windows.view(-1, self.window_size * self.window_size)
            attn_mask = mask_windows.unsqueeze(1) - mask_windows.unsqueeze(2)
            attn_mask = attn_mask.masked_fill(attn_mask != 0, -100.0).masked_fill(attn_mask == 0, 0.0)
        else:
            attn_mask = None
        self.register_buffer("attn_mask", attn_mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        H, W = self.input_resolution
        B, L, C = x.shape
        shortcut = x
        x = self.norm1(x).view(B, H, W, C)
        if self.shift_size > 0:
            shifted_x = torch.roll(x, shifts=(-self.shift_size, -self.shift_size), dims=(1, 2))
        else:
            shifted_x = x
        x_windows = window_partition(shifted_x, self.window_size)  # nW*B, ws*ws, C
        attn_windows = self.attn(x_windows, mask=self.attn_mask)  # nW*B, ws*ws, C
        attn_windows = attn_windows.view(-1, self.window_size, self.window_size, C)
        shifted_x = window_reverse(attn_windows, self.window_size, H, W)  # B H' W' C
        if self.shift_size > 0:
            x = torch.roll(shifted_x, shifts=(self.shift_size, self.shift_size), dims=(1, 2))
        else:
            x = shifted_x
        x = shortcut + x.view(B, H * W, C)
        return x + self.mlp(self.norm2(x))


class SwinStage(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.patch_embed = nn.Linear(IN_CHANS, DIM)
        self.embed_norm = nn.LayerNorm(DIM)
        self.blocks = nn.ModuleList(
            [
                SwinTransformerBlock(
                    DIM, (HEIGHT, WIDTH), N_HEADS, 0 if i % 2 == 0 else WINDOW // 2, self.computed
                )
                for i in range(N_LAYERS)
            ]
        )
        self.norm = nn.LayerNorm(DIM)

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, _ = x.shape
        x = self.embed_norm(self.patch_embed(x)).view(B, H * W, DIM)  # B, L, C
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x).view(B, H, W, DIM)


def build(seed: int = 0) -> SwinStage:
    torch.manual_seed(seed)
    return SwinStage().eval()


def sample_batch() -> tuple[torch.Tensor]:
    """x (2, 4, 4, IN_CHANS): a float feature map (no tokens, no padding)."""
    g = torch.Generator().manual_seed(2)
    return (torch.randn(2, HEIGHT, WIDTH, IN_CHANS, generator=g),)
