"""attnscope's command line: the application layer above ``core`` (the model, capture, analysis)
and ``models`` (the zoo and the registry that loads any model by name or path).

``python -m attnscope`` and ``python -m core`` run the same commands (``attnscope.cli.main``).
"""
