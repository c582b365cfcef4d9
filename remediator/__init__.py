"""numaguard remediator: finds cross-socket and GPU-starved pods and fixes them safely."""
