"""The memory mover's helper: the one process of the exporter's pod that holds
CAP_SYS_PTRACE (helper.py), the move it makes (pages.py), and what it and the exporter
say to each other (wire.py)."""
