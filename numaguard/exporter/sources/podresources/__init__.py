"""The kubelet's PodResources v1 gRPC API: ``api.proto`` and the modules protoc makes
of it (committed, so that installing numaguard needs no compiler). The exporter uses
the messages (``api_pb2``) with grpclib; ``api_pb2_grpc`` (grpcio's) serves only the
simulated kubelet. ``make proto`` regenerates them; a test fails when they are stale."""
