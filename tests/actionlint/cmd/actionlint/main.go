// actionlint (github.com/rhysd/actionlint v1.7.12), which `make lint` runs on the release
// workflows: upstream's cmd/actionlint/main.go, unchanged.
package main

import (
	"os"

	"github.com/rhysd/actionlint"

	_ "time/tzdata"
)

func main() {
	cmd := actionlint.Command{
		Stdin:  os.Stdin,
		Stdout: os.Stdout,
		Stderr: os.Stderr,
	}
	os.Exit(cmd.Main(os.Args))
}
