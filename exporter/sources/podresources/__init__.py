"""The kubelet's PodResources v1 gRPC API: ``api.proto`` and the modules protoc makes
of it (committed, so that installing numaguard needs no compiler). ``make proto``
regenerates them; a test fails when they are stale."""
