"""``python -m tf_op``: the ``tvmdsoop`` command (tf_op.cli)."""

import sys

from tf_op.cli import main

sys.exit(main())
