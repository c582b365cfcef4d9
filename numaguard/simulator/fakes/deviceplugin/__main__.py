"""``python -m numaguard.simulator.fakes.deviceplugin GPUS.json``: serve the fake GPU node's
whole GPUs to the kubelet as nvidia.com/gpu (see the package)."""

import sys

from numaguard.simulator.fakes.deviceplugin import main

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
