"""bertviz's head view and model view as one self-contained, offline, injection-safe HTML page.

bertviz (``head_view(..., html_action="return")``) writes ``<script src=cdnjs...>`` for
require.js and has require.js fetch d3 and jQuery from cdnjs; it also pastes its parameters
(tokens included) into a ``<script>`` with ``json.dumps``, so a token ``</script><script>...``
would end the script and start the user's. Here the same page is built from bertviz's own
JavaScript files (read from the installed package) with three changes:

1. require.js, d3 and jQuery are inlined from ``dashboard/static/vendor/`` (fetched once with
   ``npm pack``; see its README), and bertviz's ``require.config`` (the CDN paths) is removed:
   d3 and jQuery are registered as named AMD modules, so nothing is fetched.
2. The parameters are JSON with ``<``, ``>`` and ``&`` written as ``\\u003c`` etc.: no token can
   close the script. bertviz renders tokens with d3's ``.text()``, so they show as text.
3. A Content-Security-Policy allows only this page's own scripts (by nonce) and no network
   at all (``default-src 'none'``).

``data_from_args`` turns attnscope.core.traces.bertviz_adapter's ``BertvizArgs`` (its layer/head/token subset for
long inputs) into this page's data; ``render(view, data, layers, heads)`` keeps the model's own
layer and head numbers in the labels.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from attnscope.core.traces.bertviz_adapter import BertvizArgs
from attnscope.core.traces.trace import AttentionTrace

VENDOR = Path(__file__).resolve().parent / "static" / "vendor"
VENDOR_FILES = ("jquery-3.7.1.min.js", "d3-5.7.0.min.js", "require-2.3.6.js")
BERTVIZ_NAMES = {"enc_self": "Encoder", "dec_self": "Decoder", "cross": "Cross"}
_SCRIPT_END = re.compile(r"</script", re.IGNORECASE)
_REQUIRE_CONFIG = re.compile(r"require\.config\(\{.*?\}\);", re.DOTALL)


def js_json(obj) -> str:
    """JSON that is safe inside ``<script>``: no ``<``, ``>``, ``&`` or line separators literally."""
    text = json.dumps(obj, ensure_ascii=True, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _inline_js(code: str) -> str:
    # "</script" or "<!--" inside a script element would end or confuse it; in JS strings and
    # regexes "<\/" means "</" (the vendored files contain neither; this is a guard).
    return _SCRIPT_END.sub(lambda m: "<\\/" + m.group(0)[2:], code).replace("<!--", "<\\!--")


@lru_cache(maxsize=1)
def _vendor_js() -> str:
    return "\n".join(_inline_js((VENDOR / name).read_text(encoding="utf-8")) for name in VENDOR_FILES)


@lru_cache(maxsize=2)
def _bertviz_js(view: str) -> str:
    import bertviz

    code = (Path(bertviz.__file__).parent / f"{view}_view.js").read_text(encoding="utf-8")
    code, n = _REQUIRE_CONFIG.subn("/* require.config (CDN paths) removed by attnscope */", code, count=1)
    if n != 1 or code.count("PYTHON_PARAMS") < 1:
        raise RuntimeError(
            f"bertviz {view}_view.js has an unexpected layout; update dashboard/bertviz_html.py"
        )
    return code


def _display(tokens: Sequence[str]) -> list[str]:
    # bertviz's prettify_tokens (BPE markers) plus visible whitespace; d3 shows them as text.
    out = []
    for t in tokens:
        t = str(t).replace("Ġ", " ").replace("▁", " ").replace("</w>", "")
        out.append({" ": "␣", "\n": "↵", "\t": "⇥", "": "∅"}.get(t, t))
    return out


def attention_data(
    trace: AttentionTrace, kinds: Sequence[str], drop_pad: bool = True, decimals: int = 4
) -> list[dict]:
    """bertviz's ``attn_data``: one entry per kind with ``attn`` [layer][head][q][k] and token lists."""
    data = []
    for kind in kinds:
        probs = trace.probs(kind)
        q_tok, k_tok = trace.axes(kind)
        qi = np.arange(len(q_tok))
        ki = np.arange(len(k_tok))
        if drop_pad:
            qi = np.array([i for i, t in enumerate(q_tok) if t != "<pad>"], dtype=int)
            ki = np.array([j for j, t in enumerate(k_tok) if t != "<pad>"], dtype=int)
        attn = np.round(probs[:, :, qi][:, :, :, ki].astype(np.float64), decimals)
        data.append(
            {
                "name": BERTVIZ_NAMES[kind] if len(kinds) > 1 else None,
                "attn": attn.tolist(),
                "left_text": _display([q_tok[i] for i in qi]),
                "right_text": _display([k_tok[j] for j in ki]),
            }
        )
    return data


def data_from_args(args: BertvizArgs, decimals: int = 4) -> list[dict]:
    """bertviz's ``attn_data`` from attnscope.core.traces.bertviz_adapter.bertviz_args: only the layers, heads
    and tokens it chose (``args.layers`` / ``args.heads``), one entry per attention kind."""
    kw = args.kwargs
    if "attention" in kw:  # one self-attention (encoder-only or decoder-only)
        entries = [(None, kw["attention"], kw["tokens"], kw["tokens"])]
    else:
        enc, dec = kw["encoder_tokens"], kw["decoder_tokens"]
        entries = [
            (name, kw[key], q, k)
            for name, key, q, k in (
                ("Encoder", "encoder_attention", enc, enc),
                ("Decoder", "decoder_attention", dec, dec),
                ("Cross", "cross_attention", dec, enc),
            )
            if key in kw
        ]
    data = []
    for name, layers, q_tok, k_tok in entries:
        attn = np.stack([np.asarray(t[0]) for t in layers])[args.layers]  # (layer, head, q, k)
        attn = np.nan_to_num(attn, nan=0.0, posinf=0.0, neginf=0.0)  # (JSON has no NaN: bertviz_args says so)
        if attn.shape[1] != len(args.heads):  # the model view gets every head; keep the chosen ones
            attn = attn[:, args.heads]
        data.append(
            {
                "name": name if len(entries) > 1 else None,
                "attn": np.round(attn.astype(np.float64), decimals).tolist(),
                "left_text": _display(q_tok),
                "right_text": _display(k_tok),
            }
        )
    return data


def view_height(view: str, data: list[dict]) -> int:
    """Pixel height the view needs (bertviz's own layout constants)."""
    n = max(max(len(d["left_text"]), len(d["right_text"])) for d in data)
    if view == "head":
        return int(n * 22.5 + 30 + 70)
    n_layers, n_heads = len(data[0]["attn"]), len(data[0]["attn"][0])
    thumb = n * 7 * (12 / n_heads) + 10
    return int(max(n_layers * thumb + 38, n * 18 + 55) + 60)


def render(
    view: str, data: list[dict], layers: Sequence[int] | None = None, heads: Sequence[int] | None = None
) -> str:
    """A full HTML document with bertviz's ``view`` ('head' or 'model') for ``data``.

    layers / heads: the model's numbers of the layers and heads in ``data`` (default 0, 1, ...).
    """
    if view not in ("head", "model"):
        raise ValueError("view must be 'head' or 'model'")
    nonce = secrets.token_urlsafe(16)
    vis_id = f"bertviz-{secrets.token_hex(8)}"
    n_layers, n_heads = len(data[0]["attn"]), len(data[0]["attn"][0])
    layers = [int(i) for i in layers] if layers is not None else list(range(n_layers))
    heads = [int(h) for h in heads] if heads is not None else list(range(n_heads))
    if len(layers) != n_layers or len(heads) != n_heads:
        raise ValueError(f"data has {n_layers} layers x {n_heads} heads, labels {len(layers)} x {len(heads)}")
    if view == "head":
        params = {
            "attention": data,
            "default_filter": "0",
            "root_div_id": vis_id,
            "layer": None,
            "heads": None,
            "include_layers": layers,
        }
    else:
        params = {
            "attention": data,
            "default_filter": "0",
            "display_mode": "light",
            "root_div_id": vis_id,
            "include_layers": layers,
            "include_heads": heads,
            "total_heads": n_heads,
        }
    # Filter names are fixed strings (Encoder/Decoder/Cross), never user text.
    options = "".join(f'<option value="{i}">{d["name"]}</option>' for i, d in enumerate(data))
    select = f'Attention: <select id="filter">{options}</select>' if len(data) > 1 else ""
    layer_select = 'Layer: <select id="layer"></select> ' if view == "head" else ""
    code = _inline_js(_bertviz_js(view).replace("PYTHON_PARAMS", js_json(params)))
    csp = f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; img-src data:"
    return f"""<!doctype html>
<html><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<style>body {{ margin: 0; background: white; color: black; }} select {{ font-size: 13px; }}</style>
</head><body>
<script nonce="{nonce}">{_vendor_js()}</script>
<script nonce="{nonce}">
define("jquery", [], function () {{ return window.jQuery; }});
define("d3", [], function () {{ return window.d3; }});
</script>
<div id="{vis_id}" style="font-family:'Helvetica Neue', Helvetica, Arial, sans-serif;">
<span style="user-select:none">{layer_select}{select}</span>
<div id="vis"></div>
</div>
<script nonce="{nonce}">
{code}
</script>
</body></html>
"""
