import sys

from numaguard.exporter.cli import main

sys.exit(main())
