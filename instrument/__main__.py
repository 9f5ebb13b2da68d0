"""``python -m instrument`` runs the command line."""

import sys

from instrument.cli import main

sys.exit(main())
