"""attnscope.core: the model side of attnscope, laid out as data flows.

- ``transformer``: the encoder-decoder of "Attention Is All You Need", from scratch.
- ``families``: every model family behind one ``AttentionModel`` interface, and the capture of
  attention from any PyTorch model.
- ``traces``: ``AttentionTrace`` and its files.
- ``analysis``: what is computed from traces and models (mask audit, mask bugs, head analytics,
  corpus statistics).

``core`` imports nothing from ``attnscope.models``, ``attnscope.dashboard`` or the command line.
"""
