import sys

from numaguard.exporter.mover.helper import main

sys.exit(main())
