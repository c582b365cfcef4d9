"""Kubelet PodResources source: which devices, exclusive CPUs and memory the kubelet
gave each container, and what it can still give, over gRPC v1 on its unix socket; and
its CPU manager's policy and options, from its configuration file.

The client is grpclib (gRPC over h2, on the event loop): two small unary calls a cycle
do not need grpcio's C core, which cost ~10 MiB more of the exporter's RSS, and its
threads. After a failed call the channel is dropped and made afresh on the next cycle,
so a restarted kubelet (a new socket file) is found again at once.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import replace
from typing import TYPE_CHECKING

import h2.exceptions
from google.protobuf.message import DecodeError
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from numaguard.exporter.readers import ParseError
from numaguard.exporter.readers.kubeletconfig import KubeletConfig, parse_kubelet_config
from numaguard.exporter.readers.podresources import (
    read_allocatable,
    read_list,
)
from numaguard.exporter.records import Issue, KubeletReading
from numaguard.exporter.sources.podresources import api_pb2

if TYPE_CHECKING:
    from numaguard.exporter.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
MAX_CONFIG_BYTES = 1 << 20  # a KubeletConfiguration is a few KiB
_SERVICE = "/v1.PodResourcesLister/"


class _RawAnswers(ProtoCodec):
    """Requests serialized as usual; answers left as the bytes the kubelet sent, so that
    an answer equal to last cycle's is not decoded again."""

    def decode(self, data: bytes, message_type) -> bytes:
        return bytes(data)


class PodResourcesSource:
    """Read on the event loop (``read`` is a coroutine): the calls wait on the socket,
    and an answer is decoded only when its bytes changed."""

    def __init__(
        self, socket_path: str = DEFAULT_SOCKET, timeout: float = 2.0, config: str | None = None
    ) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self.config = config  # the kubelet's configuration file; None: not read
        self._config_said = ""  # what was last said of it
        self._config_read: tuple[tuple, KubeletConfig] | None = None  # (its stat, what it says)
        self._channel: Channel | None = None  # made on first use, on the running loop
        self._last: dict[str, tuple[bytes, object]] = {}  # method -> (answer, its reading)

    async def read(self) -> KubeletReading:
        reading = await self._read_api()
        config = self._config() if self.config is not None else None
        return replace(reading, config=config) if config is not None else reading

    def _config(self) -> KubeletConfig | None:
        """The kubelet's config file, parsed again only when it changed (the kubelet reads
        it at start). None when it cannot be read or the kubelet would not take it: said
        once, never a failure of the PodResources collector, which it is no part of."""
        assert self.config is not None
        try:
            seen = os.stat(self.config)
            key = (seen.st_ino, seen.st_size, seen.st_mtime_ns, seen.st_ctime_ns)
            if self._config_read is None or self._config_read[0] != key:
                if not stat.S_ISREG(seen.st_mode) or seen.st_size > MAX_CONFIG_BYTES:
                    raise ParseError(f"not a file of at most {MAX_CONFIG_BYTES} bytes")
                with open(self.config, "rb") as f:  # UTF-8, comments and all
                    data = f.read(MAX_CONFIG_BYTES + 1)
                if len(data) > MAX_CONFIG_BYTES:  # grew since the stat
                    raise ParseError(f"over {MAX_CONFIG_BYTES} bytes")
                text = data.decode("utf-8")
                self._config_read = (key, parse_kubelet_config(text))
            self._config_said = ""
            return self._config_read[1]
        except FileNotFoundError:  # many a node keeps it elsewhere
            said = f"no kubelet config at {self.config}: its CPU and Topology Managers' "
            said += "policies are unknown "
            said += "(--kubelet-config names it)"
        except (OSError, UnicodeDecodeError, ParseError) as err:
            said = f"the kubelet config {self.config} is left unread: {err}"
        self._config_read = None
        if said != self._config_said:
            self._config_said = said
            log.warning(said, extra={"path": self.config})
        return None

    async def _read_api(self) -> KubeletReading:
        if not os.path.exists(self.socket_path):
            self.close()
            return _failed(Issue("missing", self.socket_path, "no kubelet socket"))
        if self._channel is None:
            self._channel = Channel(path=os.path.abspath(self.socket_path), codec=_RawAnswers())
        try:
            listed = await self._call("List", api_pb2.ListPodResourcesRequest())
            pods = self._parsed("List", listed, api_pb2.ListPodResourcesResponse, read_list)
            try:
                answer = await self._call(
                    "GetAllocatableResources", api_pb2.AllocatableResourcesRequest()
                )
            except GRPCError as err:
                if err.status is not Status.UNIMPLEMENTED:
                    raise
                allocatable = None  # kubelets before 1.23 (or with the gate off)
            else:
                allocatable = self._parsed(
                    "GetAllocatableResources",
                    answer,
                    api_pb2.AllocatableResourcesResponse,
                    read_allocatable,
                )
            return KubeletReading(pods, allocatable)
        except TimeoutError:
            self.close()
            return _failed(Issue("timeout", self.socket_path, f"no answer in {self.timeout:g}s"))
        except GRPCError as err:
            self.close()
            return _failed(Issue("kubelet", self.socket_path, f"{err.status.name}: {err.message}"))
        except (
            OSError,
            StreamTerminatedError,
            ProtocolError,
            h2.exceptions.ProtocolError,
            NotImplementedError,  # a compressed answer, which we never ask for
        ) as err:
            self.close()
            return _failed(Issue("kubelet", self.socket_path, repr(err)))
        except (ParseError, DecodeError) as err:
            return _failed(Issue("parse", self.socket_path, str(err)))

    async def _call(self, method: str, request) -> bytes:
        """One unary call, its answer left as the bytes the kubelet sent."""
        stream = self._channel.request(
            _SERVICE + method,
            Cardinality.UNARY_UNARY,
            type(request),
            bytes,
            timeout=self.timeout,
        )
        async with stream:
            await stream.send_message(request, end=True)
            answer = await stream.recv_message()
        if answer is None:
            raise GRPCError(Status.UNKNOWN, "an answer without a message")
        return answer

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


def open_source(settings: Settings) -> PodResourcesSource | None:
    """The kubelet's PodResources API: always when a socket was named; the default one
    only where it exists (on a Kubernetes node), so that a laptop run stays quiet."""
    path = settings.pod_resources_socket
    if path is None:
        if not os.path.exists(DEFAULT_SOCKET):
            log.info(
                "no kubelet PodResources socket at %s: devices are attributed to pods by "
                "their processes only",
                DEFAULT_SOCKET,
            )
            return None
        path = DEFAULT_SOCKET
    config = os.path.join(settings.host_root, settings.kubelet_config.lstrip("/"))
    return PodResourcesSource(
        path, timeout=min(2.0, settings.collector_timeout_seconds / 2), config=config
    )
