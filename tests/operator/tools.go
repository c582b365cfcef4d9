//go:build tools

// Package parts pins the Prometheus Operator that numaguard's tests run against the test
// control plane, so that it, not we, decides how the exporters are scraped; no code of
// ours is built from it.
package parts

import _ "github.com/prometheus-operator/prometheus-operator/cmd/operator"
