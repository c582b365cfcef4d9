"""The remediator's pure core: findings, the finding kinds, policy, history, evidence,
capacity, the planner, the queries it asks and how a fix's outcome is judged. No I/O and
no Kubernetes or HTTP client: tests/test_layers.py holds every module under this prefix
to that, so a new file cannot escape it."""
