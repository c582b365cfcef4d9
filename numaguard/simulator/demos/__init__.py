"""The demos: ``make demo`` (``loop``: the whole loop on a simulated cluster), one node's
exporter view (``exporter_view``), and ``make demo-node`` (``real_node``, telling the
stories of ``node_stories`` through a real kubelet, which the tests tell too)."""
