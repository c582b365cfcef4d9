"""The simulated cluster on a real control plane: its life (``simulated``), its nodes'
kubelet (``agent``), a node and what its kubelet admits (``node``), the objects made for
preset pods (``manifests``), and a synthetic fleet's series (``fleet``)."""
