"""``python -m vendored_flash_attn info [--json]``."""

import sys

from .cli import main

sys.exit(main())
