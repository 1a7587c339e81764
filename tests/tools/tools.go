//go:build tools

// Pins the upstream main packages built by scripts/build_cluster.sh from build.env's PACKAGES.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
