import sys

from attnscope.cli import main

sys.exit(main())
