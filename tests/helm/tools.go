//go:build tools

// Package parts pins the helm that numaguard's tests render and lint the chart with;
// no code of ours is built from it.
package parts

import _ "helm.sh/helm/v3/cmd/helm"
