// Command kubelet is the upstream kubelet, built unchanged from k8s.io/kubernetes
// (cmd/kubelet/kubelet.go at the version pinned in go.mod, the same release as the control
// plane in tests/cluster/go.mod) for Praesto's node test tier.
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	os.Exit(cli.Run(app.NewKubeletCommand(context.Background())))
}
