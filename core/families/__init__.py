"""Model families behind one interface (attnscope's Transformer, Hugging Face folders, adapter files) and the capture of attention from any PyTorch model."""
