// Command kubelet is the upstream kubelet, built from the k8s.io/kubernetes module, for the real
// node (containerd + runc + CNI) that joins the local cluster.
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	os.Exit(cli.Run(app.NewKubeletCommand(context.Background())))
}
