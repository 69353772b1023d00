"""The Transformer of "Attention Is All You Need": config, masks, positions, attention, layers, model, decoding, tokenizers, checkpoints."""
