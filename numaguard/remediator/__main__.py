import sys

from numaguard.remediator.cli import main

sys.exit(main())
