// Command containerd is the upstream containerd daemon, built unchanged from
// github.com/containerd/containerd/v2 (cmd/containerd at the version pinned in go.mod)
// for Praesto's node test tier.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/containerd/containerd/v2/cmd/containerd/command"

	_ "github.com/containerd/containerd/v2/cmd/containerd/builtins"
)

func main() {
	if err := command.App().Run(context.Background(), os.Args); err != nil {
		_, _ = fmt.Fprintln(os.Stderr, "containerd:", err)
		os.Exit(1)
	}
}
