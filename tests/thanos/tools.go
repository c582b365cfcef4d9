//go:build tools

// Package parts pins the Thanos (sidecar, query) that numaguard's fleet tier runs over
// sharded, replicated Prometheus servers; no code of ours is built from it.
package parts

import (
	_ "github.com/thanos-io/thanos/cmd/thanos"
)
