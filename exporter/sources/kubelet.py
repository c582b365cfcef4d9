"""Kubelet PodResources source: which devices, exclusive CPUs and memory the kubelet
gave each container, and what it can still give, over gRPC v1 on its unix socket.

The channel reconnects by itself; after a failed call it is dropped and made afresh on
the next cycle, so a restarted kubelet (a new socket file) is found again at once.
grpc is imported on first use: it costs ~25 MiB of RSS, which nodes without a kubelet
socket need not pay.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from exporter.readers import ParseError
from exporter.readers.podresources import (
    Allocatable,
    PodResources,
    read_allocatable,
    read_list,
)
from exporter.sources import Issue

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
_MAX_MESSAGE = 16 << 20  # the kubelet's own limit on this API


@dataclass(frozen=True, slots=True)
class KubeletReading:
    pods: tuple[PodResources, ...] | None  # None: the kubelet did not answer (see issues)
    allocatable: Allocatable | None  # None also for kubelets without GetAllocatableResources
    issues: list[Issue] = field(default_factory=list)


class PodResourcesSource:
    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout: float = 2.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._channel = None  # grpc.Channel, made on first use
        self._last: dict[str, tuple[bytes, object]] = {}  # method -> (answer, its reading)

    def read(self) -> KubeletReading:
        import grpc
        from google.protobuf.message import DecodeError

        from exporter.sources.podresources import api_pb2

        if not os.path.exists(self.socket_path):
            self.close()
            return _failed(Issue("missing", self.socket_path, "no kubelet socket"))
        if self._channel is None:
            self._channel = grpc.insecure_channel(
                f"unix://{os.path.abspath(self.socket_path)}",
                options=[("grpc.max_receive_message_length", _MAX_MESSAGE)],
            )
        try:
            listed = self._call("List", api_pb2.ListPodResourcesRequest())
            pods = self._parsed("List", listed, api_pb2.ListPodResourcesResponse, read_list)
            try:
                answer = self._call(
                    "GetAllocatableResources", api_pb2.AllocatableResourcesRequest()
                )
                allocatable = self._parsed(
                    "GetAllocatableResources",
                    answer,
                    api_pb2.AllocatableResourcesResponse,
                    read_allocatable,
                )
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                allocatable = None  # kubelets before 1.23 (or with the gate off)
            return KubeletReading(pods, allocatable)
        except grpc.RpcError as err:
            self.close()
            reason = "timeout" if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED else "kubelet"
            return _failed(Issue(reason, self.socket_path, f"{err.code().name}: {err.details()}"))
        except (ParseError, DecodeError) as err:
            return _failed(Issue("parse", self.socket_path, str(err)))

    def _call(self, method: str, request) -> bytes:
        """One call, its answer left as the bytes the kubelet sent."""
        call = self._channel.unary_unary(
            f"/v1.PodResourcesLister/{method}", request_serializer=type(request).SerializeToString
        )
        return call(request, timeout=self.timeout)

    def _parsed(self, method: str, answer: bytes, message, reader):
        """The answer read, or last cycle's reading when the bytes are the same: a node's
        allocations change when pods come and go, not every cycle."""
        last = self._last.get(method)
        if last is not None and last[0] == answer:
            return last[1]
        reading = reader(message.FromString(answer))
        self._last[method] = (answer, reading)
        return reading

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None


def _failed(issue: Issue) -> KubeletReading:
    return KubeletReading(None, None, [issue])
