import sys

from remediator.cli import main

sys.exit(main())
