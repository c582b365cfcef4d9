"""What the exporter and the remediator agree on, and the one place each fact of it is
said: the metric catalogue (names, labels, help, what queries and dashboards read), the
reasons of the verdicts, and the Kubernetes names (annotations, labels, extended
resources) one writes and the other reads. Neither half imports the other; both import
this, and this imports nothing of theirs."""
