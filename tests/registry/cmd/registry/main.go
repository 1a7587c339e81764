// The CNCF distribution registry as the OCI tests run it: upstream's own root command
// (cmd/registry/main.go of distribution v3.1.2) with the storage drivers and auth backends the
// tests use: filesystem and inmemory storage; token and htpasswd auth.
package main

import (
	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/auth/htpasswd"
	_ "github.com/distribution/distribution/v3/registry/auth/token"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
)

func main() {
	// nolint:errcheck // the root command exits non-zero itself on failure
	registry.RootCmd.Execute()
}
