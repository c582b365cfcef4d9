//go:build tools

// Package parts pins the Prometheus 3 and promtool that numaguard's rule, dashboard and
// alert tests run against beside Debian's Prometheus 2; no code of ours is built from it.
package parts

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
