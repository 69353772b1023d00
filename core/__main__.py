"""``python -m core ...``: the command line, kept under its historic name (it lives in attnscope.cli,
above core, because it loads models by zoo name through ``models.registry``)."""

import sys

from attnscope.cli import main

sys.exit(main())
