"""``python -m clawgym_cli`` is the ``clawgym`` command."""

import sys

from clawgym_cli.main import main

sys.exit(main())
