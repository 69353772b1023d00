"""What attention moves, for models seen through capture: the values the weights multiply and the
output projection that reads the merged heads, found from lineage.

A head's output at query i is sum_j alpha_ij f_h(x_j) with f_h(x) = (x W_V,h + b_V,h) W_O,h. Capture sees
the two halves apart:

- the product weights @ values: the values' slices are laid out as the weights are (the same leading
  dims: batch and head, however folded), so the values of head h, key j are found through the
  weights' layout (``bh_values``);
- a projection later reads the heads merged back, (B, L, H*dv) in some order: the lineage codes of
  its input say which value feature every input column holds, so the columns of W_O that head h's
  features meet are found (``head_columns``), whatever order the heads were merged in.

With both, the norms ||f_h(x_j)|| are exact (``value_norms``). When the projection cannot be found (the
model never merges the heads through one projection, or it is not a linear map), the norms are
||v_j|| and say so: "without the output projection".
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from attnscope.core.families import lineage

WITH_WO = "with the output projection"
WITHOUT_WO = "without the output projection"


def bh_values(layout: lineage.Layout, weights_shape: tuple[int, ...], v: torch.Tensor) -> torch.Tensor | None:
    """The values of a product ``weights @ v`` laid out (B, H, k, dv) as the weights' layout lays out
    the weights, or None when the product is not of that plain form (keys last in the weights, second
    to last in the values, the weights' rows one per (leading slice, query))."""
    if len(weights_shape) < 2 or v.dim() < 2 or layout.dim not in (len(weights_shape) - 1, -1):
        return None
    q, k = int(weights_shape[-2]), int(weights_shape[-1])
    if int(v.shape[-2]) != k or layout.keys != k:
        return None
    lead = tuple(int(s) for s in weights_shape[:-2])
    try:
        vb = v.broadcast_to((*lead, k, int(v.shape[-1]))).reshape(-1, k, int(v.shape[-1]))
    except RuntimeError:
        return None
    rows = layout.rows.to(v.device)  # (B, H, q'): row = lead index * q + row in the slice
    if q < 1:
        return None
    lead_all = rows // q  # the leading slice each of a head's query rows is in
    lead_idx = lead_all[..., 0]  # (B, H)
    if not bool((lead_all == lead_idx[..., None]).all()):  # one head's rows in several slices: they
        return None  # multiply different values (not this form)
    return vb[lead_idx]  # (B, H, k, dv): a slice may hold several heads' rows (queries folded with heads)


def head_columns(v_codes: torch.Tensor, x_codes: torch.Tensor) -> torch.Tensor | None:
    """(H, dv) the input column of the projection each head's value feature meets, from lineage codes:
    ``v_codes`` (B, H, k, dv) of the values, ``x_codes`` (..., C) of the projection's input (the heads
    merged back). None when a feature is met by no column, or by different columns on different rows."""
    feats_v = v_codes[0, :, 0, :] & lineage.FEATURES  # (H, dv): the value projection's feature of each
    x_rows = x_codes.reshape(-1, x_codes.shape[-1]) & lineage.FEATURES  # (rows, C)
    col_feat = x_rows[0]
    if not bool((x_rows == col_feat).all()):
        return None
    order = torch.argsort(col_feat)
    sorted_feat = col_feat[order]
    pos = torch.searchsorted(sorted_feat, feats_v.reshape(-1))
    pos = pos.clamp_max(sorted_feat.numel() - 1)
    if not bool((sorted_feat[pos] == feats_v.reshape(-1)).all()):
        return None
    if sorted_feat.unique().numel() != sorted_feat.numel():  # two columns hold one feature
        return None
    return order[pos].view(feats_v.shape)


class HeadValues:
    """One attention call's values and output projection: enough to rebuild every contribution.

    The values are made on first use (``make``), so a capture that is never asked what moves pays
    nothing for them; ``make`` may find that they cannot be trusted and give None."""

    def __init__(
        self,
        values: torch.Tensor | None = None,
        w_o: torch.Tensor | None = None,
        b_o: torch.Tensor | None = None,
        make: Callable[[], torch.Tensor | None] | None = None,
        watch: tuple[torch.Tensor | None, ...] = (),
    ):
        self._values, self._make = values, make
        self.w_o = w_o  # (H, D, dv): head h's slice of the output projection, None if not found
        self.b_o = b_o  # (D,)
        # the model's tensors these are read from (values, weights, the projection's parameters) as they were
        # when the weights met the values: written since (a KV cache's next step, an optimizer step), they are
        # not what moved, so nothing is shown
        self._watch = [(t, _version(t)) for t in (*watch, w_o, b_o) if t is not None]

    def watch(self, *tensors: torch.Tensor) -> None:
        """Tensors read from later (a bias found after the product), as they are now."""
        self._watch += [(t, _version(t)) for t in tensors]

    def intact(self) -> bool:
        """Whether no tensor these are read from was written since the weights met the values."""
        return all(_version(t) == at for t, at in self._watch)

    @property
    def values(self) -> torch.Tensor | None:
        """(B, H, k, dv) what the weights multiply (None: they could not be confirmed, or the tensors they
        are read from were written since)."""
        if not self.intact():
            return None
        if self._make is not None:
            self._values, self._make = self._make(), None
        return self._values

    def vectors(self) -> torch.Tensor | None:
        """f_h(x_j), (B, H, k, D) (or the values themselves without the projection)."""
        v = self.values
        if v is None or self.w_o is None:
            return v
        return torch.einsum("bhke,hde->bhkd", v, self.w_o.to(v.dtype))

    def norms(self, with_projection: bool = True) -> torch.Tensor | None:
        """||f_h(x_j)||, (B, H, k), through each head's Gram matrix (no (B, H, k, D) tensor);
        ``with_projection`` False: the values' own norms."""
        v = self.values
        if v is None:
            return None
        v = v.float()
        if self.w_o is None or not with_projection:
            return v.norm(dim=-1)
        w = self.w_o.float()
        gram = torch.einsum("hde,hdf->hef", w, w)
        return torch.einsum("bhke,hef,bhkf->bhk", v, gram, v).clamp_min(0).sqrt()

    @property
    def scope(self) -> str:
        return WITH_WO if self.w_o is not None else WITHOUT_WO


def _version(t: torch.Tensor) -> int:
    """A tensor's version counter (each write in place adds one; -1 where it keeps none: inference tensors)."""
    try:
        return int(t._version)
    except RuntimeError:
        return -1


def projection_slices(weight: torch.Tensor, cols: torch.Tensor, transposed: bool) -> torch.Tensor:
    """(H, D, dv) W_O,h from a projection's weight: F.linear's (D, C) (``transposed`` False) or x @ W's
    (C, D) (True), and the columns each head's features meet (H, dv)."""
    w = weight.detach().t() if transposed else weight.detach()  # (D, C)
    return w[:, cols].permute(1, 0, 2)  # (D, H, dv) -> (H, D, dv)


def finite_norms(
    kind: str, value: np.ndarray | None, residual: np.ndarray | None
) -> tuple[np.ndarray | None, np.ndarray | None, str | None]:
    """A kind's value and residual norms as a trace may hold them, and what was left out: NaN or infinity
    (weights that went NaN in training, NaN in the data) is no norm to show, and a file with it would not
    open. Value norms that are not finite leave both out (the residual's share is read against them);
    residual norms alone leave only the residual out."""
    if value is not None and not np.isfinite(value).all():
        return (
            None,
            None,
            f"{kind}: what attention moves is left out of the trace, its values hold NaN or infinity",
        )
    if residual is not None and not np.isfinite(residual).all():
        return value, None, (f"{kind}: the residual stream's share of what attention moves is left out of the "
                             "trace, the residual stream holds NaN or infinity")  # fmt: skip
    return value, residual, None
