//go:build tools

// Package parts pins the node VM's container runtime, containerd 2.x (the daemon, its runc
// shim and ctr, which imports the locally built images); no code of ours is built from it.
package parts

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
