// Command ctr is containerd's own client, built unchanged from github.com/containerd/containerd/v2
// (cmd/ctr); the node tier imports its locally built images with `ctr images import`.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/containerd/containerd/v2/cmd/ctr/app"
)

func main() {
	if err := app.New().Run(context.Background(), os.Args); err != nil {
		_, _ = fmt.Fprintln(os.Stderr, "ctr:", err)
		os.Exit(1)
	}
}
