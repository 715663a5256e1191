"""``python -m irdma``: the irdma command, for environments without its script on PATH."""

import sys

from .cli.main import main

sys.exit(main())
