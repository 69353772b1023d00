"""Where people train: ``attnscope.integrations.hf.AttnscopeCallback`` (a Hugging Face ``TrainerCallback``)
and ``attnscope.integrations.lightning.AttnscopeCallback`` (a PyTorch Lightning ``Callback``), both
``attnscope.watch`` underneath. Each is imported on its own, so neither framework is needed by the other."""
