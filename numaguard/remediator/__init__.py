"""numaguard remediator: finds cross-socket and GPU-starved pods and fixes them safely."""

# Its libraries are an extra the exporter does without: a missing one says so plainly.
# (The Kubernetes client, of the same extra, is loaded by kube.py alone: the pure core
# runs without it.)
try:
    import pandas  # noqa: F401
    import promql_parser  # noqa: F401
except ImportError as err:
    raise ImportError(
        f"numaguard's remediator needs {err.name}: pip install 'numaguard[remediator]'"
    ) from None
