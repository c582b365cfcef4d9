"""The metric catalogue: every metric numaguard exports, declared once.

Collectors, the remediator's queries, alert rules and dashboards take names from here
only (a test checks it). Every series also carries ``node``, added by
``numaguard.exporter.exposition.Family``; ``make docs`` writes docs/metrics.md from it.
``spec`` says what a declaration is; the modules below declare by topic, in the order
docs/metrics.md lists them, and every name they declare is read here as
``catalogue.NAME``.
"""

# the order is docs/metrics.md's, not the alphabet's
# ruff: noqa: I001
from numaguard.contract.catalogue.spec import *  # noqa: F403
from numaguard.contract.catalogue.health import *  # noqa: F403
from numaguard.contract.catalogue.numa import *  # noqa: F403
from numaguard.contract.catalogue.pods import *  # noqa: F403
from numaguard.contract.catalogue.traffic import *  # noqa: F403
from numaguard.contract.catalogue.gpus import *  # noqa: F403
from numaguard.contract.catalogue.zones import *  # noqa: F403
from numaguard.contract.catalogue.remediator import *  # noqa: F403
