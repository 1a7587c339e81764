// The ORAS CLI (oras.land/oras v1.3.6), the real client the OCI tests push artifacts with:
// upstream's cmd/oras/main.go, unchanged.
package main

import (
	"context"
	"os"
	"os/signal"

	"oras.land/oras/cmd/oras/root"
)

func main() {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
	defer cancel()
	if err := root.New().ExecuteContext(ctx); err != nil {
		cancel()
		os.Exit(1)
	}
}
