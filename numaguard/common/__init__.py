"""What both processes run alike: logging, the API server's connection and its
kubeconfig, the web config (TLS, basic auth, Kubernetes auth) and the process's own
metrics."""
