"""move_pages(2) over a fake host's container processes: the fake kernel the memory
mover's tests move pages through, as strict as the real one."""

from __future__ import annotations

import errno

from numaguard.exporter.mover.pages import KernelRefused
from numaguard.exporter.readers import parse_id_list
from numaguard.simulator.fakes.host import (
    BASE_PAGE,
    LIBC,
    RESERVED,
    FakeContainer,
    FakeHost,
    heap_at,
)


class FakePages:
    """move_pages(2) over a fake host's container processes, as memory_mover.Kernel calls
    it, and as strict as the kernel: an unknown PID is ESRCH; a caller without ptrace
    access to the pod (no CAP_SYS_PTRACE) EPERM; an offline node ENODEV; a node outside
    the container's cpuset.mems EACCES; per page, an address outside its mappings EFAULT,
    a library page (mapped by others) EACCES, no free memory on the node ENOMEM. With
    ``folio_pages`` (512: transparent huge pages) the heap is in folios of that many
    pages, aligned in memory as the kernel aligns them: the first address of one in a
    call moves it whole, its others in that call are EBUSY, as the kernel says. A moved
    page moves the container's memory_by_node and the node's free memory with it: write
    the host root again to show it. With ``hinted``, NUMA balancing has marked the heap's
    pages on that node for a hinting fault: Debian's Linux 6.1 (measured in the node VM)
    answers ENOENT for them, for where they are and for a move, though numa_maps shows
    them."""

    def __init__(
        self, host: FakeHost, ptrace: bool = True, folio_pages: int = 1, hinted: int | None = None
    ) -> None:
        self.host, self.ptrace, self.folio_pages = host, ptrace, folio_pages
        self.hinted = hinted
        self.calls = 0
        self._heaps: dict[int, bytearray] = {}  # pid -> the node of each heap page

    def move_pages(self, pid: int, addresses, node: int | None) -> list[int]:
        self.calls += 1
        found = self._container(pid)
        if found is None:
            raise KernelRefused(errno.ESRCH, f"no process {pid}")
        if not self.ptrace:
            raise KernelRefused(errno.EPERM, "ptrace access denied")
        ctr = found
        size = self.host.page_size
        heap = self._heap(pid, ctr)
        nodes = self.host.nodes
        if node is not None:
            if not 0 <= node < len(nodes):
                raise KernelRefused(errno.ENODEV, f"node {node} is not online")
            mems = parse_id_list(ctr.mems) if ctr.mems is not None else range(len(nodes))
            if node not in mems:
                raise KernelRefused(errno.EACCES, f"node {node} is outside cpuset.mems")
        status = []
        moved_now: set[int] = set()  # folios this call moved
        reserved = ctr.reserved or (0, 0)
        last = RESERVED + reserved[0] - size  # the reservation's one page
        for address in addresses:
            page = (address - heap_at(size)) // size
            folio = (address // size) // self.folio_pages  # folios align in memory
            if RESERVED <= address < RESERVED + reserved[0]:
                if address != last:
                    status.append(-errno.ENOENT)  # never touched: no page there
                else:
                    if node is not None:
                        ctr.reserved = (reserved[0], node)
                    status.append(ctr.reserved[1])
            elif LIBC <= address < LIBC + 2 * size:
                status.append(0 if node in (None, 0) else -errno.EACCES)
            elif address % size or not 0 <= page < len(heap):
                status.append(-errno.EFAULT)
            elif heap[page] == self.hinted:
                status.append(-errno.ENOENT)
            elif node is not None and folio in moved_now:
                status.append(-errno.EBUSY)
            elif node is None or heap[page] == node:
                status.append(heap[page])
            else:
                first = folio * self.folio_pages - heap_at(size) // size
                pages = range(max(0, first), min(len(heap), first + self.folio_pages))
                # a hugetlb page comes from the node's pool, a base page from its memory
                pool = nodes[node].free_hugepages if size > BASE_PAGE else None
                if (
                    pool.get(size, 0) < len(pages)
                    if pool is not None
                    else nodes[node].memory_free_bytes < len(pages) * size
                ):
                    status.append(-errno.ENOMEM)
                    continue
                for p in pages:
                    if pool is not None:
                        away = nodes[heap[p]].free_hugepages
                        away[size] = away.get(size, 0) + 1
                        pool[size] -= 1
                    else:
                        nodes[heap[p]].memory_free_bytes += size
                        nodes[node].memory_free_bytes -= size
                    ctr.memory_by_node[heap[p]] -= size
                    ctr.memory_by_node[node] = ctr.memory_by_node.get(node, 0) + size
                    heap[p] = node
                moved_now.add(folio)
                status.append(node)
        return status

    def _container(self, pid: int) -> FakeContainer | None:
        for pod in self.host.pods:
            for ctr in pod.containers:
                if self.host.pid(pod, ctr) == pid:
                    return ctr
        return None

    def _heap(self, pid: int, ctr: FakeContainer) -> bytearray:
        """The heap's pages, node by node in order, as process_mappings shows them."""
        size = self.host.page_size
        want = {n: b // size for n, b in sorted(ctr.memory_by_node.items()) if b >= size}
        heap = self._heaps.get(pid)
        if heap is None or {n: heap.count(n) for n in set(heap)} != {
            n: p for n, p in want.items() if p
        }:
            heap = self._heaps[pid] = bytearray(b"".join(bytes([n]) * p for n, p in want.items()))
        return heap
